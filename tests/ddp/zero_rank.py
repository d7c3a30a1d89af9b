"""ZeRO-1 and activation checkpointing under DDP, on every rank; rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 3 python tests/ddp/zero_rank.py      # tests/ddp/test_zero_mpi.py runs it

Bodies valid at any world size. The oracle is plain DDP with the same inner optimizer on the
same per-rank batches: ZeRO must end with the same parameters, float64 within 1e-12, float32
within 1e-5 (measured: a few 1e-8). Not bit-identical: plain DDP all-reduces grad/n with SUM,
ZeRO reduce-scatters the sum with AVG, so the averages differ in the last bit; AdamW's
m / sqrt(v) can turn a last-bit difference of a near-zero gradient into a visible one in the
update (bounded by lr per step), hence 1e-5 rather than float32's 1e-7 for 4 steps. Tiny bucket
caps give several buckets, and bucket sizes that n = 3 and 4 do not divide exercise the
tail that every rank steps itself. Activation checkpointing must give bit-identical float64
gradients under DDP, with dropout and with a no_sync micro-batch.
"""

from __future__ import annotations

import json
import sys
import traceback

import numpy as np

from minidist import comm, nn
from minidist.ddp import DistributedDataParallel, ZeroRedundancyOptimizer
from minidist.optim import SGD, AdamW
from minidist.tensor import Tensor
from minidist.utils import checkpoint_sequential

B, D = 4, 7  # per-rank batch, width (7: buckets n = 3 and 4 cannot split evenly)
CAPS = dict(bucket_cap_mb=200 * 8 / 2**20, first_bucket_cap_mb=60 * 8 / 2**20)


class Net(nn.Module):
    def __init__(self, dtype=np.float64, p_drop=0.0, segments=0):
        super().__init__()
        nn.manual_seed(0)
        layers = []
        for _ in range(3):
            layers += [nn.Linear(D, D, dtype=dtype), nn.Tanh()]
            if p_drop:
                layers.append(nn.Dropout(p_drop))
        self.body = nn.Sequential(*layers, nn.Linear(D, 2, dtype=dtype))
        self.segments = segments

    def forward(self, x):
        if self.segments:
            return checkpoint_sequential(self.body, self.segments, x)
        return self.body(x)


def batches(steps, world, rank, dtype, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, world * B, D)).astype(dtype)
    y = rng.normal(size=(steps, world * B, 2)).astype(dtype)
    return x[:, rank * B:(rank + 1) * B], y[:, rank * B:(rank + 1) * B]


def loss_fn(out, y):
    return ((out - Tensor(y)) ** 2).mean()


def make_opt(zero, model, ddp, opt_cls, **opt_kw):
    """zero: False (plain optimizer), True (ZeRO over the DDP's buckets) or "params" (torch's
    signature without ddp=: parameters partitioned, in two groups to exercise them)."""
    if zero == "params":
        params = list(model.parameters())
        groups = [{"params": params[:3]}, {"params": params[3:], "lr": opt_kw["lr"] / 2}]
        return ZeroRedundancyOptimizer(groups, optimizer_class=opt_cls, **opt_kw)
    if zero:
        return ZeroRedundancyOptimizer(model.parameters(), opt_cls, ddp=ddp, **opt_kw)
    params = list(model.parameters())
    return opt_cls([{"params": params[:3]}, {"params": params[3:], "lr": opt_kw["lr"] / 2}],
                   **opt_kw) if zero is None else opt_cls(params, **opt_kw)


def train(zero, opt_cls, dtype, steps, rank, world, resume_at=None, **opt_kw):
    """Returns final params (and, with resume_at, the params of a run resumed from there)."""
    model = Net(dtype)
    ddp = DistributedDataParallel(model, **CAPS)
    opt = make_opt(zero, model, ddp, opt_cls, **opt_kw)
    xs, ys = batches(steps, world, rank, dtype)
    saved = None
    for t in range(steps):
        if t == resume_at:
            saved = (model.state_dict(), opt.state_dict())
        loss_fn(ddp(Tensor(xs[t])), ys[t]).backward()
        opt.step()
        opt.zero_grad()
    final = [p.array.copy() for p in model.parameters()]
    ddp.close()
    if saved is None:
        return final, None
    model2 = Net(dtype)
    ddp2 = DistributedDataParallel(model2, **CAPS)
    opt2 = make_opt(zero, model2, ddp2, opt_cls, **opt_kw)
    model2.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    for t in range(resume_at, steps):
        loss_fn(ddp2(Tensor(xs[t])), ys[t]).backward()
        opt2.step()
        opt2.zero_grad()
    resumed = [p.array.copy() for p in model2.parameters()]
    ddp2.close()
    return final, resumed


def max_diff(a, b):
    return max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b))


def same_everywhere(params):
    flat = np.concatenate([p.reshape(-1).astype(np.float64) for p in params])
    return bool(np.array_equal(comm.all_gather(flat).min(0), comm.all_gather(flat).max(0)))


def ckpt_grads(segments, p_drop, rank, world, micro):
    """Grads after one synced DDP backward (the first micro-1 micro-batches under no_sync)."""
    model = Net(np.float64, p_drop=p_drop, segments=segments)
    ddp = DistributedDataParallel(model, **CAPS)
    fired = {}
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda t: fired.__setitem__(id(t), fired.get(id(t), 0) + 1))
    xs, ys = batches(micro, world, rank, np.float64)
    nn.manual_seed(10 + rank)  # dropout masks: different per rank, same for both runs
    for m in range(micro):
        if m < micro - 1:
            with ddp.no_sync():
                loss_fn(ddp(Tensor(xs[m])), ys[m]).backward()
        else:
            loss_fn(ddp(Tensor(xs[m])), ys[m]).backward()
    grads = [p.grad.array.copy() for p in model.parameters()]
    ddp.close()
    return grads, set(fired.values())


def main():
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    res = {"world_size": world}

    # 1. ZeRO == plain DDP with the same optimizer (float64 and float32), ranks agree
    for name, cls, kw in (("adamw", AdamW, dict(lr=1e-2, weight_decay=0.1)),
                          ("sgd", SGD, dict(lr=0.05, momentum=0.9))):
        for dtype in (np.float64, np.float32):
            plain, _ = train(False, cls, dtype, 4, rank, world, **kw)
            zero, _ = train(True, cls, dtype, 4, rank, world, **kw)
            key = f"{name}/{np.dtype(dtype).name}"
            res[key] = {"max_diff": max_diff(zero, plain), "same_everywhere": same_everywhere(zero)}

    # 1b. torch's signature without ddp= (parameters partitioned, two groups) == plain DDP
    #     with the same two groups: the same gradients and per-parameter math, so same bits
    for name, cls, kw in (("adamw", AdamW, dict(lr=1e-2, weight_decay=0.1)),
                          ("sgd", SGD, dict(lr=0.05, momentum=0.9))):
        for dtype in (np.float64, np.float32):
            plain, _ = train(None, cls, dtype, 4, rank, world, **kw)
            zero, _ = train("params", cls, dtype, 4, rank, world, **kw)
            res[f"params/{name}/{np.dtype(dtype).name}"] = {
                "same_bits": all(np.array_equal(a, b) for a, b in zip(zero, plain)),
                "same_everywhere": same_everywhere(zero)}
    # resumed from its (collective) state dict: the bits of the plain optimizer resumed so
    # (a fresh DDP's first all-reduce may round differently at n >= 3, so not of a straight run)
    _, resumed = train("params", AdamW, np.float64, 4, rank, world, resume_at=2, lr=1e-2)
    _, plain_resumed = train(None, AdamW, np.float64, 4, rank, world, resume_at=2, lr=1e-2)
    res["params/resume_same_bits"] = all(np.array_equal(a, b)
                                         for a, b in zip(resumed, plain_resumed))
    model = Net()
    ddp = DistributedDataParallel(model, **CAPS)
    zopt = make_opt("params", model, ddp, AdamW, lr=1e-2)
    popt = make_opt(None, Net(), None, AdamW, lr=1e-2)
    xs, ys = batches(1, world, rank, np.float64)
    loss_fn(ddp(Tensor(xs[0])), ys[0]).backward()
    for p, q in zip(model.parameters(), popt.param_groups[0]["params"] +
                    popt.param_groups[1]["params"]):
        q.grad = p.grad.array.copy()
    zopt.step()
    popt.step()
    zsd, psd = zopt.state_dict(), popt.state_dict()          # collective without consolidate
    res["params/state_dict_equals_plain"] = (
        sorted(zsd["state"]) == sorted(psd["state"]) and
        all(np.array_equal(zsd["state"][i][k], psd["state"][i][k]) for i in psd["state"]
            for k in ("exp_avg", "exp_avg_sq")) and
        [g["lr"] for g in zsd["param_groups"]] == [g["lr"] for g in psd["param_groups"]])
    res["params/owned"] = comm.all_gather_object(len(zopt.optim.state))
    ddp.close()

    # 2. resume from the (collective, consolidated) state dict == a straight run: same bits
    straight, resumed = train(True, AdamW, np.float64, 4, rank, world, resume_at=2, lr=1e-2)
    res["resume_same_bits"] = all(np.array_equal(a, b) for a, b in zip(straight, resumed))

    # 3. the consolidated state dict equals plain AdamW's (torch's layout, whole model)
    model = Net()
    ddp = DistributedDataParallel(model, **CAPS)
    zopt = ZeroRedundancyOptimizer(model.parameters(), AdamW, ddp=ddp, lr=1e-2)
    xs, ys = batches(1, world, rank, np.float64)
    loss_fn(ddp(Tensor(xs[0])), ys[0]).backward()
    zopt.step()
    zopt.consolidate_state_dict(to=0)
    if rank == 0:
        sd = zopt.state_dict()
        res["state_keys"] = sorted(sd["state"][0])
        res["state_shapes_ok"] = all(sd["state"][i]["exp_avg"].shape == p.array.shape
                                     for i, p in enumerate(model.parameters()))
    try:
        zopt.step()
    except RuntimeError as e:
        res["stale_step_error"] = str(e)
    ddp.close()

    # 4. checkpointing under DDP: bit-identical grads, with dropout, with no_sync; hooks once
    for p_drop in (0.0, 0.3):
        plain, _ = ckpt_grads(0, p_drop, rank, world, micro=2)
        ckpt, fired = ckpt_grads(3, p_drop, rank, world, micro=2)
        res[f"ckpt/p{p_drop}"] = {"same_bits": all(np.array_equal(a, b) for a, b in zip(plain, ckpt)),
                                  "hook_fires": sorted(fired)}

    # 5. bad input: a parameter list that differs between ranks
    if world > 1:
        model = Net()
        ddp = DistributedDataParallel(model, **CAPS)
        params = list(model.parameters())
        if rank == world - 1:
            params = params[:-1]
        try:
            ZeroRedundancyOptimizer(params, AdamW, ddp=ddp, lr=1e-3)
            res["mismatch_error"] = None
        except ValueError as e:
            res["mismatch_error"] = str(e)
        ddp.close()

    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        raise
