"""Step 5: overlap: start a bucket's all-reduce while backward is still computing the others.

    ./mpirun.sh -n 2 python examples/course/05_overlap.py
    ./mpirun.sh -n 2 python examples/course/05_overlap.py --bucket-kb 64

Backward finishes the gradients last layer first. A post-accumulate-grad hook on every
parameter copies its gradient into its bucket; when a bucket is full, the hook hands it to a
communication thread, which all-reduces it while the main thread goes on with backward:

    main:  backward L6 L5 | L4 L3 | L2 L1 |  wait  copy out
    comm:                 | ar(b0)| ar(b1)| ar(b2)
                          ^ bucket 0 full: launched here, not after backward

One comm thread keeps the buckets in the same order on every rank, so the ranks' messages
match. Overlap pays only when the communication has a core (or a network) of its own: see
docs/course.md and overlap_slow_link.py. (The library: minidist/ddp/reducer.py.)
"""

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import minidist as md
from minidist import nn


def build(width, depth):
    nn.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


class BucketReducer:
    """Step 4's buckets, now filled by hooks during backward; ``overlap`` launches them early."""

    def __init__(self, params, cap_bytes, overlap, group=None):
        self.overlap, self.group, self.buckets, current, size = overlap, group, [], [], 0
        for p in reversed(params):  # the order backward finishes them
            if current and size + p.array.nbytes > cap_bytes:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p.array.nbytes
        self.buckets.append(current)
        self.flats = [np.empty(sum(p.data.size for p in b), np.float32) for b in self.buckets]
        self.where = {}
        for i, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.where[id(p)] = (i, offset)
                offset += p.data.size
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self.comm = ThreadPoolExecutor(max_workers=1)  # ONE thread: buckets stay in order
        self._reset()

    def _reset(self):
        self.missing, self.launched = [len(b) for b in self.buckets], []

    def _grad_ready(self, p):  # called by backward the moment p.grad is complete
        i, offset = self.where[id(p)]
        self.flats[i][offset:offset + p.grad.size] = p.grad.array.reshape(-1)
        self.missing[i] -= 1
        if self.missing[i] == 0 and self.overlap:
            self.launched.append(self.comm.submit(md.all_reduce, self.flats[i], "avg", "ring",
                                                  self.group))

    def finish(self):
        """After backward: wait for (or run) every bucket, copy the averages back into p.grad."""
        if self.overlap:
            for f in self.launched:
                f.result()
        else:
            for flat in self.flats:
                md.all_reduce(flat, op="avg", algorithm="ring", group=self.group)
        for bucket, flat in zip(self.buckets, self.flats):
            for p in bucket:
                _, offset = self.where[id(p)]
                p.grad.array[...] = flat[offset:offset + p.grad.size].reshape(p.grad.shape)
        self._reset()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bucket-kb", type=float, default=256, help="bucket cap in KiB")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a tiny model, few repeats (tests)")
    args = ap.parse_args()
    width, depth = (32, 2) if args.quick else (256, 6)
    repeats = 3 if args.quick else args.repeats
    group = md.init_process_group()
    n, r = group.size, group.rank
    x = np.random.default_rng(1).normal(size=(64 * n, width)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 10, 64 * n)
    mine = slice(64 * r, 64 * (r + 1))

    times, grads = {}, {}
    for overlap in (False, True):
        model = build(width, depth)
        reducer = BucketReducer(list(model.parameters()), int(args.bucket_kb * 1024), overlap)
        samples = []
        for _ in range(repeats + 1):  # the first one warms up; not timed
            model.zero_grad()
            md.barrier()
            t0 = time.perf_counter()
            nn.CrossEntropyLoss()(model(md.Tensor(x[mine])), md.Tensor(y[mine])).backward()
            reducer.finish()
            samples.append(time.perf_counter() - t0)
        reducer.comm.shutdown()
        times[overlap] = float(np.median(samples[1:]))
        grads[overlap] = [p.grad.array.copy() for p in model.parameters()]
    if r == 0:
        print(f"n={n}, {len(reducer.buckets)} buckets of <= {args.bucket_kb:g} KiB; "
              f"forward+backward+all-reduce per step:")
        gain, ms = times[False] / times[True], {k: f"{v * 1e3:.2f} ms" for k, v in times.items()}
        print(f"  after backward: {ms[False]}   overlapped: {ms[True]}   "
              f"(ratio {gain:.2f}: overlap {'paid' if gain > 1 else 'did not pay'} here)")
    ok = all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(grads[False], grads[True]))
    print(f"[rank {r}/{n}] check: overlapped gradients equal the after-backward ones: "
          f"{'OK' if ok else 'FAILED'}", flush=True)
    md.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
