"""What a gradient that starts mid-cache-line costs the product that writes it and the step
that reads it.

    .venv/bin/python benchmarks/bucket_alignment.py                    # 1024x1024, 40 rounds
    .venv/bin/python benchmarks/bucket_alignment.py --rows 512 --rounds 20

DDP keeps every gradient as a view of its bucket, so where a view starts is decided by the
bucket's layout: packed end to end, a weight after a 10-element bias starts 40 bytes into a
cache line, and one in rank 1's slot of a shared window starts wherever rank 0's slot ended.
Both are now laid out on cache lines (ddp/bucket.py, fastpath/shm_window.py); this script
measures what that is worth, in one process, with one BLAS thread::

    grad = view of a flat buffer, starting 0, 16 or 40 bytes into a 64-byte line
    product:   matmul(x.T, dy, out=grad)     the weight's gradient, (64 x rows).T @ (64 x cols)
    step:      SGD with momentum on a parameter whose .grad is that view (minidist.optim)

Each round times every offset once, the order rotating; the table shows each offset's median
and its ratio to the aligned view's median.

Output: a table on stdout, ``bucket_alignment.json`` in ``--out`` (default runs/bench/,
git-ignored).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread, as every rank runs
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import LOCAL_RESULTS, Parser, Table, machine_info, shown, usage_error  # noqa: E402
from _common import write_json  # noqa: E402

OFFSETS = (0, 16, 40)  # bytes into a cache line: aligned, NumPy's own start, after 10 floats


def measure(rows: int, cols: int, rounds: int) -> dict[int, dict[str, float]]:
    """Median seconds of the product and of the step, per offset."""
    import numpy as np

    from minidist import optim
    from minidist.tensor import Tensor

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, rows)).astype(np.float32)
    dy = rng.normal(size=(64, cols)).astype(np.float32)
    raw = np.zeros(rows * cols + 64, np.float32)
    lead = -raw.ctypes.data % 64 // 4  # elements up to the first line boundary
    param = Tensor(rng.normal(size=(rows, cols)).astype(np.float32), requires_grad=True)
    opt = optim.SGD([param], lr=1e-3, momentum=0.9)
    views = {off: raw[lead + off // 4: lead + off // 4 + rows * cols].reshape(rows, cols)
             for off in OFFSETS}
    times: dict[int, dict[str, list[float]]] = {off: {"product": [], "step": []}
                                                for off in OFFSETS}
    for r in range(rounds + 2):  # two warm-up rounds (the optimizer's state, the caches)
        order = OFFSETS[r % len(OFFSETS):] + OFFSETS[:r % len(OFFSETS)]
        for off in order:
            grad = views[off]
            t0 = time.perf_counter()
            np.matmul(x.T, dy, out=grad)
            t1 = time.perf_counter()
            param.grad = grad
            opt.step()
            t2 = time.perf_counter()
            if r >= 2:
                times[off]["product"].append(t1 - t0)
                times[off]["step"].append(t2 - t1)
    return {off: {k: statistics.median(v) for k, v in t.items()} for off, t in times.items()}


def main() -> None:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1024, help="the weight's rows (default 1024)")
    p.add_argument("--cols", type=int, default=1024, help="its columns (default 1024)")
    p.add_argument("--rounds", type=int, default=40, help="timed rounds (default 40)")
    p.add_argument("--out", type=Path, default=LOCAL_RESULTS, help="folder for the JSON")
    args = p.parse_args()
    if args.rows < 1 or args.cols < 1 or args.rounds < 1:
        usage_error("--rows, --cols and --rounds take a positive number")
    med = measure(args.rows, args.cols, args.rounds)
    table = Table([("offset (B)", 10, "d"), ("product (ms)", 12, ".3f"), ("x aligned", 9, ".3f"),
                   ("step (ms)", 9, ".3f"), ("x aligned", 9, ".3f")])
    print(f"# a {args.rows}x{args.cols} float32 gradient view starting OFFSET bytes into a "
          f"cache line; medians of {args.rounds} rounds, one thread")
    print(table.header())
    rows = []
    for off in OFFSETS:
        m, a = med[off], med[0]
        row = {"offset_bytes": off, "product_ms": m["product"] * 1e3,
               "product_ratio": m["product"] / a["product"], "step_ms": m["step"] * 1e3,
               "step_ratio": m["step"] / a["step"]}
        rows.append(row)
        print(table.row(off, row["product_ms"], row["product_ratio"], row["step_ms"],
                        row["step_ratio"]))
    path = write_json(args.out / "bucket_alignment.json",
                      {"rows": rows, "shape": [args.rows, args.cols], "rounds": args.rounds,
                       "machine": machine_info()})
    print(f"# wrote {shown(path)}")


if __name__ == "__main__":
    main()
