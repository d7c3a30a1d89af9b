"""Run at n=2 under ``python -m minidist.launch``: ``model.require_backward_grad_sync`` as
nanoGPT uses it (gradient accumulation), at float32 and with the float16 GradScaler.

Checks on every rank: the flagged micro-steps send nothing (the reducer syncs once per
optimizer step), the accumulated gradient equals the one ``no_sync`` gives, bit for bit, and
the parameters stay equal across ranks. Prints "grad sync ok" on rank 0.
"""

import numpy as np

import minidist
from minidist import amp, nn, optim
from minidist import DistributedDataParallel as DDP

ACCUM, STEPS = 4, 3


def build():
    minidist.manual_seed(0)
    return DDP(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)))


def batch(rank, step, micro):
    rng = np.random.default_rng(1000 * step + 10 * micro + rank)
    return minidist.Tensor(rng.normal(size=(5, 6)).astype(np.float32)), rng.integers(0, 3, 5)


def train(model, use_flag, scaler=None):
    opt = optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for step in range(STEPS):
        syncs = model.reducer.num_syncs
        for micro in range(ACCUM):
            x, y = batch(minidist.get_rank(), step, micro)
            last = micro == ACCUM - 1
            if use_flag:                      # nanoGPT's way
                model.require_backward_grad_sync = last
            with amp.autocast("cpu", enabled=scaler is not None):
                if use_flag or last:
                    loss = nn.functional.cross_entropy(model(x), y) / ACCUM
                else:
                    with model.no_sync():
                        loss = nn.functional.cross_entropy(model(x), y) / ACCUM
            if use_flag or last:
                (scaler.scale(loss) if scaler else loss).backward()
            else:
                with model.no_sync():
                    (scaler.scale(loss) if scaler else loss).backward()
        assert model.reducer.num_syncs == syncs + 1, (model.reducer.num_syncs, syncs)
        grads.append([p.grad.array.copy() for p in model.parameters()])
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
    return grads


def main():
    minidist.init_process_group()
    for scaler in (None, amp.GradScaler("cpu")):
        a, b = build(), build()
        want = train(a, use_flag=False, scaler=scaler)
        got = train(b, use_flag=True, scaler=amp.GradScaler("cpu") if scaler else None)
        for gs, ws in zip(got, want):
            for g, w in zip(gs, ws):
                np.testing.assert_array_equal(g, w)
        flat = np.concatenate([p.array.ravel() for p in b.parameters()])
        everyone = minidist.comm.all_gather(flat)
        assert (everyone == everyone[0]).all(), "parameters differ across ranks"
        assert b.require_backward_grad_sync is True
        a.close()
        b.close()
    if minidist.get_rank() == 0:
        print("grad sync ok")
    minidist.destroy_process_group()


if __name__ == "__main__":
    main()
