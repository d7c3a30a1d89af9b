"""A rank that skips a training step fails at its next bucket (minidist/watch/step_labels.py).

    ./mpirun.sh -n 2 python tests/ddp/skipped_step_rank.py CASE
    python tests/ddp/skipped_step_rank.py --threads 2 CASE

Cases:
    after_forward   rank 1 computes the loss of batch 5, then ``continue`` (a "bad" loss)
    before_forward  rank 1 skips batch 5 before the model sees it
    clean           what must not be taken for a skip: two epochs, ``no_sync`` accumulation,
                    an evaluation pass on every rank, rank 0 alone peeking at a sharded
                    loader and reading an unsharded one between steps, and ``join`` with
                    rank 0 leaving two batches early

Prints ``RESULT {json}`` per rank: the steps it completed, the error (type and message) or
None, and a digest of its parameters.
"""

import argparse
import hashlib
import json

import numpy as np

import minidist as md
from minidist import nn, optim
from minidist.comm.transports.threads import run_threads
from minidist.data import ArrayDataset, DataLoader, DistributedSampler

SKIPPED = 5  # the batch rank 1 skips


def train(group: md.ProcessGroup, case: str) -> dict:
    r = group.rank
    md.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    ddp = md.DistributedDataParallel(model, process_group=group)
    opt = optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    x = np.random.default_rng(0).normal(size=(160, 8)).astype(np.float32)
    data = ArrayDataset(x, (x[:, 0] > 0).astype(np.int64))
    shard = dict(num_replicas=group.size, rank=r)
    loader = DataLoader(data, batch_size=4,
                        sampler=DistributedSampler(data, shuffle=True, seed=0, **shard))
    evaluation = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, **shard))
    unsharded = DataLoader(data, batch_size=32)
    steps, error = 0, None

    def step(xb, yb):
        nonlocal steps
        opt.zero_grad()
        loss_fn(ddp(xb), yb).backward()
        opt.step()
        steps += 1

    try:
        if case in ("after_forward", "before_forward"):
            for i, (xb, yb) in enumerate(loader):
                if r == 1 and i == SKIPPED:
                    if case == "after_forward":
                        loss_fn(ddp(xb), yb)  # the loss looked bad: no backward, no step
                    continue
                step(xb, yb)
        elif case == "clean":
            for epoch in range(2):
                loader.set_epoch(epoch)
                for i, (xb, yb) in enumerate(loader):
                    if r == 0 and i == 2:
                        next(iter(evaluation))  # a peek: the pass ends at once
                        for _ in unsharded:
                            pass
                    if i % 3 == 0:  # accumulate this batch, reduce with the next
                        with ddp.no_sync():
                            loss_fn(ddp(xb), yb).backward()
                        continue
                    step(xb, yb)
                with md.no_grad():
                    for xb, _ in evaluation:
                        ddp(xb)
            with ddp.join():
                for i, (xb, yb) in enumerate(loader):
                    if r == 0 and i >= len(loader) - 2:
                        break
                    step(xb, yb)
        else:
            raise SystemExit(f"unknown case {case}")
    except Exception as e:  # noqa: BLE001 (reported to the test)
        error = f"{type(e).__name__}: {e}"
    digest = hashlib.sha256(b"".join(p.array.tobytes() for p in model.parameters()))
    ddp.close()
    return {"rank": r, "steps": steps, "error": error, "params": digest.hexdigest()[:16]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("case")
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads:
        results = run_threads(a.threads, lambda t: train(md.new_group_from_transport(t),
                                                         a.case), timeout_s=60)
    else:
        group = md.init_process_group()
        results = [train(group, a.case)]
    for res in results:
        print("RESULT " + json.dumps(res), flush=True)
    if not a.threads:
        md.destroy_process_group()


if __name__ == "__main__":
    main()
