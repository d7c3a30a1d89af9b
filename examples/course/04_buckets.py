"""Step 4: bucketing: copy the gradients into a few flat buffers, one all-reduce per bucket.

    ./mpirun.sh -n 2 python examples/course/04_buckets.py
    ./mpirun.sh -n 2 python examples/course/04_buckets.py --bucket-kb 64

Step 3 paid the per-message latency alpha once per parameter (and more: the ring sends
2(n-1) messages per all-reduce). Packing the gradients into buckets of about ``cap`` bytes
turns P all-reduces into B << P, at the price of two copies (in and out of the bucket):

    params (in reverse, the order backward finishes them): w6 b6 w5 b5 ... w1 b1
    buckets:  [ w6 b6 w5 ] [ b5 w4 b4 ] ...   each one flat float32 array
    time ~ B * 2(n-1) alpha + (bytes terms, unchanged)  instead of  P * 2(n-1) alpha

This script times both ways on the same gradients and checks they give the same average.
(The library's planner is minidist/ddp/bucket.py: plan_buckets, 1 MiB first, then 25 MiB.)
"""

import argparse
import sys
import time

import numpy as np

import minidist as md
from minidist import nn


def build(width, depth):
    nn.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def plan_buckets(params, cap_bytes):
    """Lists of parameters, in reverse order, each list holding about ``cap_bytes``."""
    buckets, current, size = [], [], 0
    for p in reversed(params):
        if current and size + p.array.nbytes > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += p.array.nbytes
    return buckets + [current]


def all_reduce_bucketed(buckets, flats):
    for bucket, flat in zip(buckets, flats):  # flats: one buffer per bucket, allocated once
        offset = 0
        for p in bucket:                                               # copy in
            flat[offset:offset + p.grad.size] = p.grad.array.reshape(-1)
            offset += p.grad.size
        md.all_reduce(flat, op="avg", algorithm="ring")
        offset = 0
        for p in bucket:                                               # copy out
            p.grad.array[...] = flat[offset:offset + p.grad.size].reshape(p.grad.shape)
            offset += p.grad.size


def all_reduce_per_param(params):
    for p in params:
        md.all_reduce(p.grad, op="avg", algorithm="ring")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bucket-kb", type=float, default=1024, help="bucket cap in KiB")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="a tiny model, few repeats (tests)")
    args = ap.parse_args()
    width, depth = (32, 2) if args.quick else (64, 12)  # many small parameters: latency-bound
    repeats = 3 if args.quick else args.repeats
    group = md.init_process_group()
    n, r = group.size, group.rank
    model = build(width, depth)
    params = list(model.parameters())
    x = np.random.default_rng(1).normal(size=(16 * n, width)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 10, 16 * n)
    mine = slice(16 * r, 16 * (r + 1))
    nn.CrossEntropyLoss()(model(md.Tensor(x[mine])), md.Tensor(y[mine])).backward()
    local = [p.grad.array.copy() for p in params]
    buckets = plan_buckets(params, int(args.bucket_kb * 1024))
    flats = [np.empty(sum(p.data.size for p in b), np.float32) for b in buckets]

    results, times = {}, {}
    for name, fn, arg in [("per-parameter", all_reduce_per_param, (params,)),
                          ("bucketed", all_reduce_bucketed, (buckets, flats))]:
        samples = []
        for _ in range(repeats + 1):  # the first run warms up buffers; not timed
            for p, g in zip(params, local):
                p.grad.array[...] = g
            md.barrier()
            t0 = time.perf_counter()
            fn(*arg)
            samples.append(time.perf_counter() - t0)
        times[name] = float(np.median(samples[1:]))
        results[name] = [p.grad.array.copy() for p in params]
    if r == 0:
        print(f"n={n}, {len(params)} parameters, {sum(g.nbytes for g in local)} B of gradients")
        per, bucketed = times["per-parameter"], times["bucketed"]
        print(f"per-parameter: {len(params)} all-reduces, {per * 1e3:.2f} ms "
              f"({per / len(params) * 1e6:.0f} us each)")
        print(f"bucketed ({args.bucket_kb:g} KiB cap): {len(buckets)} all-reduces, "
              f"{bucketed * 1e3:.2f} ms  (x{per / bucketed:.2f} the per-parameter speed)")
        print(f"bucketing {'paid' if bucketed < per else 'did not pay'} here: "
              f"{len(params) - len(buckets)} fewer messages against two copies of "
              f"{sum(g.nbytes for g in local)} B; it pays more the more each message costs")
    ok = all(np.allclose(a, b, rtol=1e-6, atol=1e-7)
             for a, b in zip(results["per-parameter"], results["bucketed"]))
    print(f"[rank {r}/{n}] check: bucketed average equals per-parameter average: "
          f"{'OK' if ok else 'FAILED'}", flush=True)
    md.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
