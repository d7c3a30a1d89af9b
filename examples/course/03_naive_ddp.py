"""Step 3: naive data parallelism: after backward, average every gradient with its own all-reduce.

    ./mpirun.sh -n 2 python examples/course/03_naive_ddp.py
    ./mpirun.sh -n 3 python examples/course/03_naive_ddp.py --steps 5

Each rank starts from the same weights (same seed), takes its own slice of the batch, runs
forward and backward, then replaces every gradient by the average over the ranks. Because
the loss is a mean, the average of n rank gradients over B samples each IS the gradient of
one process over all nB samples, so n ranks x batch B train exactly like 1 process x batch nB.
This script checks that, by also training the single-process model on every rank.

Cost: one all-reduce per parameter (P of them), each paying the latency alpha, and all of them
after backward has finished. Steps 4 and 5 remove those two costs.
(The library keeps this version as minidist/ddp/naive.py: the oracle DDP is tested against.)
"""

import argparse
import sys
import time

import numpy as np

import minidist as md
from minidist import nn, optim


def build(width, depth):
    nn.manual_seed(0)  # the same weights on every rank
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="per rank")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="a tiny model (tests)")
    args = ap.parse_args()
    if args.quick:
        args.width, args.depth = 32, 2
    group = md.init_process_group()
    n, r, B = group.size, group.rank, args.batch
    rng = np.random.default_rng(1)
    x = rng.normal(size=(args.steps, n * B, args.width)).astype(np.float32)
    y = rng.integers(0, 10, size=(args.steps, n * B))
    loss_fn = nn.CrossEntropyLoss()

    model = build(args.width, args.depth)
    opt = optim.SGD(model.parameters(), lr=0.1)
    t_backward = t_comm = 0.0
    calls = 0
    for s in range(args.steps):
        mine = slice(r * B, (r + 1) * B)  # this rank's shard of the global batch
        t0 = time.perf_counter()
        loss_fn(model(md.Tensor(x[s, mine])), md.Tensor(y[s, mine])).backward()
        t1 = time.perf_counter()
        for p in model.parameters():       # THE data-parallel part: average every gradient
            md.all_reduce(p.grad, op="avg", algorithm="ring")
            calls += 1
        if s > 0 or args.steps == 1:  # step 0 also pays one-time set-up (buffers, caches)
            t_comm += time.perf_counter() - t1
            t_backward += t1 - t0
        opt.step()
        opt.zero_grad()

    # The oracle: one process, the whole batch of n*B samples, the same steps.
    ref = build(args.width, args.depth)
    ref_opt = optim.SGD(ref.parameters(), lr=0.1)
    for s in range(args.steps):
        loss_fn(ref(md.Tensor(x[s])), md.Tensor(y[s])).backward()
        ref_opt.step()
        ref_opt.zero_grad()

    nparams = len(list(model.parameters()))
    if r == 0:
        print(f"n={n}, batch {B} per rank, {nparams} parameters "
              f"({sum(p.data.size for p in model.parameters())} elements)")
        timed = max(args.steps - 1, 1)
        print(f"per step: forward+backward {t_backward / timed * 1e3:.2f} ms, "
              f"{calls // args.steps} all-reduces {t_comm / timed * 1e3:.2f} ms")
        print(f"here communication adds {t_comm / max(t_backward, 1e-9):.1f}x the compute time "
              "to every step, all of it after backward (steps 4 and 5 attack that)")
    ok = all(np.allclose(p.array, q.array, rtol=1e-4, atol=1e-5)
             for p, q in zip(model.parameters(), ref.parameters()))
    print(f"[rank {r}/{n}] check: {n} ranks x batch {B} equal 1 process x batch {n * B} "
          f"after {args.steps} steps: {'OK' if ok else 'FAILED'}", flush=True)
    md.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
