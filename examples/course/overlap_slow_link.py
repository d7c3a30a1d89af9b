"""Step 5 again, over a slow link: here overlap visibly pays.

    .venv/bin/python examples/course/overlap_slow_link.py         # 2 thread ranks, 4 ms per message
    .venv/bin/python examples/course/overlap_slow_link.py --latency-ms 0   # no injected latency
    .venv/bin/python examples/course/overlap_slow_link.py --max-load-per-core inf   # busy or not

On the 2-core machine step 5 ran on, overlap did not pay: the communication needed the same
cores as backward. Here the ranks are threads of one process (the threads transport) and every
message waits ``--latency-ms`` first, sleeping as a slow network would: the sender's thread is
blocked but uses no CPU. That is the situation overlap is for: communication that takes time
but not the cores backward needs. Step 5's ``BucketReducer`` runs unchanged.

``SlowLink`` is a Transport like any other: it delegates to the rank's real transport.

The point needs cores to spare: on a machine busy with other work, backward and the sleeping
sender fight for the cores with those processes, and the ratio says more about them than about
overlap (0.65 under a load average of 11 on 2 cores). So the script reads the load average
before it starts and the spread of the step times it measured, and when either is too high it
says that the machine is too busy to show the point instead of printing a ratio.
"""

import argparse
import os
import runpy
import sys
import threading
import time
from pathlib import Path

import numpy as np

import minidist as md
from minidist import comm, nn
from minidist.comm.transports.base import Transport
from minidist.comm.transports.threads import run_threads

step5 = runpy.run_path(str(Path(__file__).with_name("05_overlap.py")))
BUILD = threading.Lock()  # nn.manual_seed is one generator for the process: build one at a time
MAX_SPREAD = 0.25  # interquartile range / median of a mode's step times above which it is noise


class SlowLink(Transport):
    """``inner``, with ``latency_s`` added to every message (the sending thread sleeps)."""

    name = "slow-link"

    def __init__(self, inner, latency_s):
        self.inner, self.latency_s = inner, latency_s
        self.rank, self.size = inner.rank, inner.size

    def isend(self, buf, dst, tag=0):
        time.sleep(self.latency_s)
        return self.inner.isend(buf, dst, tag)

    def irecv(self, buf, src, tag=0):
        return self.inner.irecv(buf, src, tag)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--latency-ms", type=float, default=4.0)
    ap.add_argument("--bucket-kb", type=float, default=512)
    ap.add_argument("--batch", type=int, default=1024, help="per rank (compute to hide behind)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="a tiny model, few repeats (tests)")
    ap.add_argument("--max-load-per-core", type=float, default=0.5,
                    help="the 1-minute load average per core before the run at or above which "
                         "the machine counts as too busy to show the point (default 0.5; "
                         "'inf': print the ratio whatever the load)")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # before our threads run
    width, depth = (32, 2) if args.quick else (256, 6)
    args.batch = 16 if args.quick else args.batch
    repeats = 2 if args.quick else args.repeats
    n = args.ranks
    B = args.batch
    x = np.random.default_rng(1).normal(size=(B * n, width)).astype(np.float32)
    y = np.random.default_rng(2).integers(0, 10, B * n)

    def rank_body(t):
        group = comm.new_group_from_transport(SlowLink(t, args.latency_ms / 1000))
        mine = slice(B * t.rank, B * (t.rank + 1))
        times, grads = {}, {}
        for overlap in (False, True):
            with BUILD:
                model = step5["build"](width, depth)
            reducer = step5["BucketReducer"](list(model.parameters()),
                                             int(args.bucket_kb * 1024), overlap, group)
            samples = []
            for _ in range(repeats + 1):  # the first one warms up; not timed
                model.zero_grad()
                group.barrier()
                t0 = time.perf_counter()
                nn.CrossEntropyLoss()(model(md.Tensor(x[mine])), md.Tensor(y[mine])).backward()
                reducer.finish()
                samples.append(time.perf_counter() - t0)
            reducer.comm.shutdown()
            times[overlap] = samples[1:]
            grads[overlap] = [p.grad.array.copy() for p in model.parameters()]
        ok = all(np.allclose(a, b, rtol=1e-6, atol=1e-7)
                 for a, b in zip(grads[False], grads[True]))
        return times, len(reducer.buckets), ok

    results = run_threads(n, rank_body, timeout_s=300)
    samples, nbuckets, _ = results[0]
    print(f"{n} thread ranks, {nbuckets} buckets, +{args.latency_ms:g} ms per message; "
          f"forward+backward+all-reduce per step:")
    busy = too_busy(load, cores, args.max_load_per_core, samples)
    if busy:
        print(f"  the machine is too busy to show the point: {busy}; run it again when it is "
              "quieter (docs/course.md shows a quiet run)")
    else:
        after, overlapped = (float(np.median(samples[k])) for k in (False, True))
        print(f"  after backward: {after * 1e3:.2f} ms   overlapped: {overlapped * 1e3:.2f} ms   "
              f"(ratio {after / overlapped:.2f})")
    ok = all(r[2] for r in results)
    print(f"check: overlapped gradients equal the after-backward ones on every rank: "
          f"{'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


def too_busy(load, cores, max_load_per_core, samples):
    """Why these timings cannot show what overlap does (None: they can): other processes' load
    before the run, or step times that vary more than ``MAX_SPREAD`` of their median."""
    if load >= max_load_per_core * cores:
        return (f"load average {load:.1f} on {cores} cores before the run (other processes "
                "compete for the cores that backward and the link need)")
    for overlap, name in ((False, "after backward"), (True, "overlapped")):
        q1, med, q3 = np.percentile(samples[overlap], [25, 50, 75])
        if (q3 - q1) > MAX_SPREAD * med:
            return (f"the '{name}' step times varied by {(q3 - q1) / med:.0%} of their median "
                    "(interquartile range): something else took the cores")
    return None


if __name__ == "__main__":
    sys.exit(main())
