"""Step 6: the library's DistributedDataParallel: steps 3 to 5 in one line.

    ./mpirun.sh -n 2 python examples/course/06_ddp.py
    .venv/bin/python examples/course/06_ddp.py --threads 3  # 3 thread ranks in ONE process, no MPI

    model = DistributedDataParallel(build())            # that line; the loop is unchanged

Where each earlier step lives in the library:
    step 1-2  minidist/comm/transports/ (send/recv), comm/algorithms/ring.py (+ tree, rd, ...)
    step 3    minidist/ddp/naive.py: NaiveDataParallel, kept as the oracle DDP is tested against
    step 4    minidist/ddp/bucket.py: plan_buckets (reverse order, 1 MiB first bucket, 25 MiB cap)
    step 5    minidist/ddp/reducer.py: post-accumulate-grad hooks, the comm thread, the wait
    and what the course skipped: grads as views INTO the bucket (no copy in or out), a
    pre-flight check that every rank built the same model (watch/preflight.py), no_sync().

This script trains a few steps with DDP and with step 3's NaiveDataParallel and checks the
parameters agree. ``--threads N`` runs the same code over the threads transport: each thread
gets a process group of its own (``new_group_from_transport``) and passes it as process_group.
"""

import argparse
import sys
import threading
import time

import numpy as np

import minidist as md
from minidist import comm, nn, optim
from minidist.ddp import DistributedDataParallel, NaiveDataParallel


BUILD = threading.Lock()  # thread ranks share nn.manual_seed's generator: build one at a time


def build():
    with BUILD:
        nn.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                             nn.Linear(64, 10))


def train(wrap, group, steps, B=16):
    """``steps`` SGD steps of ``wrap(model)`` on this rank's shard; returns (params, s/step)."""
    n, r = group.size, group.rank
    rng = np.random.default_rng(1)
    x = rng.normal(size=(steps, n * B, 32)).astype(np.float32)
    y = rng.integers(0, 10, size=(steps, n * B))
    model = build()
    dp = wrap(model)
    opt = optim.SGD(model.parameters(), lr=0.1)
    t0 = time.perf_counter()
    for s in range(steps):
        if s == 1:  # step 0 also pays one-time set-up (DDP: the pre-flight check): not timed
            t0 = time.perf_counter()
        mine = slice(r * B, (r + 1) * B)
        nn.CrossEntropyLoss()(dp(md.Tensor(x[s, mine])), md.Tensor(y[s, mine])).backward()
        if isinstance(dp, NaiveDataParallel):
            dp.all_reduce_gradients()     # step 3: by hand, after backward
        opt.step()                        # DDP: backward already returned averaged grads
        opt.zero_grad()
    elapsed = (time.perf_counter() - t0) / max(steps - 1, 1)
    if isinstance(dp, DistributedDataParallel):
        dp.close()
    return [p.array.copy() for p in model.parameters()], elapsed


def say(text):
    """One write per message: thread ranks share this process's stdout."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run(group, steps):
    ddp, t_ddp = train(lambda m: DistributedDataParallel(m, process_group=group), group, steps)
    naive, t_naive = train(lambda m: NaiveDataParallel(m, process_group=group), group, steps)
    ok = all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ddp, naive))
    if group.rank == 0:
        say(f"n={group.size} ({group.backend}): DDP {t_ddp * 1e3:.2f} ms/step, naive "
            f"{t_naive * 1e3:.2f} ms/step (steps 2..{steps}; a tiny model: mostly overhead)\n"
            f"DDP ran at x{t_naive / t_ddp:.2f} naive's speed here "
            f"({'faster' if t_ddp < t_naive else 'not faster'}; docs/course.md, step 6, "
            "says when it pays)")
    say(f"[rank {group.rank}/{group.size}] check: DDP parameters equal NaiveDataParallel "
        f"after {steps} steps: {'OK' if ok else 'FAILED'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="N thread ranks in this process")
    ap.add_argument("--quick", action="store_true", help="fewer steps (tests)")
    args = ap.parse_args()
    steps = 2 if args.quick else args.steps
    if args.threads:
        from minidist.comm.transports.threads import run_threads
        md.init_process_group(backend="local")  # the world of this one process (unused here)
        oks = run_threads(args.threads, lambda t: run(comm.new_group_from_transport(t), steps),
                          timeout_s=120)
        ok = all(oks)
    else:
        ok = run(md.init_process_group(), steps)
    md.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
