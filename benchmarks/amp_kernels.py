"""AMP kernel benchmark: the fused one-pass kernels beside NumPy's two passes and torch's kernel.

    NUMBA_NUM_THREADS=2 .venv/bin/python benchmarks/amp_kernels.py  # 16M elements, threads 1, 2
    .venv/bin/python benchmarks/amp_kernels.py --numel 1M --threads 1 --repeats 5
    .venv/bin/python benchmarks/amp_kernels.py --out /tmp/amp --no-plot --no-torch
    .venv/bin/python benchmarks/amp_kernels.py --markdown benchmarks/results/amp_kernels.json

Numba starts at most ``NUMBA_NUM_THREADS`` threads (``test.sh``/``mpirun.sh`` set it to 1 for
each rank), so set it in the environment to time 2 threads; the script then sets the count per
row with ``numba.set_num_threads`` (and ``torch.set_num_threads`` for torch's rows).

Cases (n elements; "bytes" = what the operation itself must read + write):

    fp32_inplace     grads32 *= inv, found = any non-finite       8 B/element (read 4, write 4)
    fp16_to_master   master32 = float32(grads16) * inv, found     6 B/element (read 2, write 4)
    master_to_model  model16 = float16(master32), nearest even    6 B/element (read 4, write 2)

Implementations:

    fused   minidist.kernels (Numba CPU, or numba.cuda on GPU rows), argument checks included
    numpy   the reference: isfinite(src).all(), then np.multiply(..., out=dst) (two passes;
            NumPy's elementwise loops use one thread whatever the thread count)
    torch   torch._amp_foreach_non_finite_check_and_unscale_ (fp32 in place); for fp16 grads
            torch has no fused unscale into fp32 master grads: master.copy_(grads16), then the
            same kernel on master (torch's GradScaler refuses fp16 grads); model16.copy_(master)
    cupy    the reference on CuPy arrays (GPU rows, when a GPU and numba.cuda are present)

Per call (a second table, ``per_call`` in the JSON): the host time of ONE call on small,
persistent buffers (``--per-call-numel``, default 1K elements; median of ``--per-call-reps``
calls), where fixed costs dominate: argument checks, dispatch, on a GPU the launch (the launch
plan is what makes it cheap there). ``foreach32`` unscales 32 float32 buffers in place: the
fused row is ONE ``kernels.foreach_unscale_and_check_`` call (one launch on a GPU), numpy the
reference's loop, torch its ``_amp_foreach_non_finite_check_and_unscale_`` over the list.

Method: every implementation's result is first checked against the reference (bits; ``exact``
in the JSON). Then ``--repeats`` rounds; in each round every implementation runs once, in a
random order (seeded by the round), so load drift on a shared machine hits all of them alike.
In-place rows alternate inv = 1/2 and 2 (exact, so the data never drifts into subnormals).
Reported: the median time, GB/s = bytes / median, and ratios to numpy and torch at the same
thread count. Output: a table on stdout, amp_kernels.json and a PNG (when matplotlib is
importable) in ``--out`` (default runs/bench/, git-ignored; the published results in
benchmarks/results/ come from ``--out benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import LOCAL_RESULTS, Table, machine_info, parse_bytes, shown, stats, write_json  # noqa: E402

from minidist import kernels  # noqa: E402
from minidist import xp as backend  # noqa: E402
from minidist.kernels import reference  # noqa: E402

CASES = {"fp32_inplace": 8, "fp16_to_master": 6, "master_to_model": 6}  # bytes per element


@dataclass
class Args:
    numel: int
    threads: list[int]
    repeats: int
    warmup: int
    out: Path
    name: str
    plot: bool
    gpu: bool
    torch: bool
    per_call_numel: int
    per_call_reps: int


def parse_args(argv: list[str] | None = None) -> Args:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--numel", default="16M", help="elements per array (16M = 16 * 2^20)")
    p.add_argument("--threads", default="1,2", help="CPU thread counts to time (default 1,2)")
    p.add_argument("--repeats", type=int, default=15, help="timed rounds (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first (compiles)")
    p.add_argument("--out", default=str(LOCAL_RESULTS),
                   help="directory for JSON/PNG (the published ones: --out benchmarks/results)")
    p.add_argument("--name", default="amp_kernels", help="file stem")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-gpu", action="store_true", help="skip the GPU rows")
    p.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    p.add_argument("--per-call-numel", default="1K", help="elements for the per-call table")
    p.add_argument("--per-call-reps", type=int, default=2000,
                   help="calls per row of the per-call table (0: no table)")
    p.add_argument("--markdown", nargs="+", metavar="JSON", help="print result tables and exit")
    a = p.parse_args(argv)
    if a.markdown:
        for path in a.markdown:
            print(markdown(json.loads(Path(path).read_text())) + "\n")
        raise SystemExit(0)
    threads = [int(t) for t in a.threads.split(",") if t.strip()]
    if not threads or min(threads) < 1 or a.repeats < 1:
        raise SystemExit("--threads needs counts >= 1 and --repeats >= 1")
    return Args(parse_bytes(a.numel), threads, a.repeats, a.warmup, Path(a.out), a.name,
                not a.no_plot, not a.no_gpu, not a.no_torch, parse_bytes(a.per_call_numel),
                a.per_call_reps)


# ----------------------------------------------------------------- workloads

@dataclass
class Run:
    """One implementation of one case: ``call()`` does the work once (and syncs a GPU)."""
    case: str
    impl: str
    threads: int | str
    call: Callable[[], Any]
    exact: bool = False


class Alternating:
    """inv_scale for in-place rows: 1/2, 2, 1/2, ... (exact: the data never drifts)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return 0.5 if self.calls % 2 else 2.0


INV16 = 2.0 ** -10  # fp16 grads were scaled by 1024


def host_data(n: int) -> dict:
    rng = np.random.default_rng(0)
    grads = (rng.standard_normal(n, dtype=np.float32) * 1024).astype(np.float32)
    return {"g32": grads, "g16": grads.astype(np.float16), "m32": np.empty(n, np.float32),
            "h16": np.empty(n, np.float16), "master": grads / np.float32(1024)}


def same_bits(a: Any, b: Any) -> bool:
    a, b = backend.to_host(a), backend.to_host(b)
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def check(runs: list[Run], outputs: dict, inputs: dict) -> None:
    """Set ``run.exact``: one call's result equals the reference's, bit for bit. In-place runs
    are called twice (x 1/2, then x 2), which leaves the shared input as it was."""
    for run in runs:
        out = outputs[run.case]
        before = backend.to_host(out).copy() if run.case == "fp32_inplace" else None
        run.call()
        if run.case == "fp32_inplace":
            run.exact = same_bits(out, before * np.float32(0.5))
            run.call()
        elif run.case == "fp16_to_master":
            run.exact = same_bits(out, inputs["g16"].astype(np.float32) * np.float32(INV16))
        else:
            with np.errstate(over="ignore"):
                run.exact = same_bits(out, inputs["master"].astype(np.float16))


def cpu_runs(d: dict, threads: int, torch: Any) -> list[Run]:
    """The CPU rows at one thread count, each checked against the reference first."""
    a, b = Alternating(), Alternating()
    runs = [
        Run("fp32_inplace", "fused", threads,
            lambda: kernels.unscale_and_check(d["g32"], d["g32"], a())),
        Run("fp32_inplace", "numpy", threads,
            lambda: reference.unscale_and_check(d["g32"], d["g32"], b())),
        Run("fp16_to_master", "fused", threads,
            lambda: kernels.unscale_and_check(d["g16"], d["m32"], INV16)),
        Run("fp16_to_master", "numpy", threads,
            lambda: reference.unscale_and_check(d["g16"], d["m32"], INV16)),
        Run("master_to_model", "fused", threads,
            lambda: kernels.master_to_model(d["master"], d["h16"])),
        Run("master_to_model", "numpy", threads,
            lambda: reference.master_to_model(d["master"], d["h16"])),
    ]
    if torch is not None:
        t32, tm32 = torch.from_numpy(d["g32"]), torch.from_numpy(d["m32"])
        t16, th16, tmaster = (torch.from_numpy(d["g16"]), torch.from_numpy(d["h16"]),
                              torch.from_numpy(d["master"]))
        found = torch.zeros(1)
        invs = {v: torch.tensor([v], dtype=torch.float32) for v in (0.5, 2.0, INV16)}
        c = Alternating()

        def torch16() -> None:
            tm32.copy_(t16)
            torch._amp_foreach_non_finite_check_and_unscale_([tm32], found, invs[INV16])

        runs += [
            Run("fp32_inplace", "torch", threads,
                lambda: torch._amp_foreach_non_finite_check_and_unscale_([t32], found,
                                                                         invs[c()])),
            Run("fp16_to_master", "torch", threads, torch16),
            Run("master_to_model", "torch", threads, lambda: th16.copy_(tmaster)),
        ]
    check(runs, {"fp32_inplace": d["g32"], "fp16_to_master": d["m32"],
                 "master_to_model": d["h16"]}, d)
    return runs


def gpu_runs(d: dict) -> list[Run]:
    """Fused numba.cuda kernels vs the CuPy reference; each call syncs (time = GPU time)."""
    import cupy as cp

    n = d["g32"].size
    g32, g16, m32 = cp.asarray(d["g32"]), cp.asarray(d["g16"]), cp.empty(n, cp.float32)
    master, h16 = cp.asarray(d["master"]), cp.empty(n, cp.float16)
    found = cp.zeros(1, cp.float32)
    sync = cp.cuda.get_current_stream().synchronize
    a, b = Alternating(), Alternating()

    def synced(fn: Callable[[], Any]) -> Callable[[], None]:
        def call() -> None:
            fn()
            sync()
        return call

    runs = [
        Run("fp32_inplace", "fused", "gpu",
            synced(lambda: kernels.unscale_and_check_(g32, g32, a(), found))),
        Run("fp32_inplace", "cupy", "gpu",
            synced(lambda: reference.unscale_and_check_(g32, g32, b(), found))),
        Run("fp16_to_master", "fused", "gpu",
            synced(lambda: kernels.unscale_and_check_(g16, m32, INV16, found))),
        Run("fp16_to_master", "cupy", "gpu",
            synced(lambda: reference.unscale_and_check_(g16, m32, INV16, found))),
        Run("master_to_model", "fused", "gpu",
            synced(lambda: kernels.master_to_model(master, h16))),
        Run("master_to_model", "cupy", "gpu",
            synced(lambda: reference.master_to_model(master, h16))),
    ]
    check(runs, {"fp32_inplace": g32, "fp16_to_master": m32, "master_to_model": h16}, d)
    return runs


# ----------------------------------------------------------------- timing

def time_rounds(runs: list[Run], repeats: int, warmup: int) -> list[list[float]]:
    """Seconds per call of every run: ``repeats`` rounds, each in a random order by round."""
    for run in runs:
        for _ in range(warmup):
            run.call()
    samples: list[list[float]] = [[] for _ in runs]
    for r in range(repeats):
        order = list(range(len(runs)))
        random.Random(r).shuffle(order)
        for i in order:
            t0 = time.perf_counter()
            runs[i].call()
            samples[i].append(time.perf_counter() - t0)
    return samples


def per_call_runs(n: int, torch: Any, xp: Any = np) -> list[Run]:
    """Small persistent buffers: what one call costs on the host (checks, dispatch, launch)."""
    on_gpu = xp is not np
    d = host_data(n)
    dev = {k: xp.asarray(v) for k, v in d.items()}
    found = xp.zeros(1, xp.float32)
    parts = [xp.asarray(np.ones(max(n // 32, 1), np.float32)) for _ in range(32)]
    a, b = Alternating(), Alternating()
    base = "cupy" if on_gpu else "numpy"
    where = "gpu" if on_gpu else 1
    runs = [
        Run("fp32_inplace", "fused", where,
            lambda: kernels.unscale_and_check_(dev["g32"], dev["g32"], a(), found)),
        Run("fp32_inplace", base, where,
            lambda: reference.unscale_and_check_(dev["g32"], dev["g32"], b(), found)),
        Run("fp16_to_master", "fused", where,
            lambda: kernels.unscale_and_check_(dev["g16"], dev["m32"], INV16, found)),
        Run("fp16_to_master", base, where,
            lambda: reference.unscale_and_check_(dev["g16"], dev["m32"], INV16, found)),
        Run("master_to_model", "fused", where,
            lambda: kernels.master_to_model(dev["master"], dev["h16"])),
        Run("master_to_model", base, where,
            lambda: reference.master_to_model(dev["master"], dev["h16"])),
        Run("foreach32", "fused", where,
            lambda: kernels.foreach_unscale_and_check_(parts, parts, 1.0, found)),
        Run("foreach32", base, where,
            lambda: reference.foreach_unscale_and_check_(parts, parts, 1.0, found)),
    ]
    if torch is not None:
        dv = "cuda" if on_gpu else "cpu"
        t32 = torch.ones(n, device=dv)
        t16, tm32 = t32.half(), torch.empty(n, device=dv)
        th16, tparts = torch.empty(n, dtype=torch.float16, device=dv), [
            torch.ones(max(n // 32, 1), device=dv) for _ in range(32)]
        tfound, one = torch.zeros(1, device=dv), torch.ones(1, device=dv)
        runs += [
            Run("fp32_inplace", "torch", where,
                lambda: torch._amp_foreach_non_finite_check_and_unscale_([t32], tfound, one)),
            Run("fp16_to_master", "torch", where, lambda: (
                tm32.copy_(t16),
                torch._amp_foreach_non_finite_check_and_unscale_([tm32], tfound, one))),
            Run("master_to_model", "torch", where, lambda: th16.copy_(t32)),
            Run("foreach32", "torch", where,
                lambda: torch._amp_foreach_non_finite_check_and_unscale_(tparts, tfound, one)),
        ]
    return runs


def time_per_call(runs: list[Run], reps: int, sync: Callable[[], None]) -> list[dict]:
    """Median host time of one call, in rounds of 100 calls in a random order by round."""
    for run in runs:
        for _ in range(3):
            run.call()
    sync()
    samples: list[list[float]] = [[] for _ in runs]
    for r in range(max(reps // 100, 1)):
        order = list(range(len(runs)))
        random.Random(r).shuffle(order)
        for i in order:
            for _ in range(100):
                t0 = time.perf_counter()
                runs[i].call()
                samples[i].append(time.perf_counter() - t0)
            sync()
    return [{"case": run.case, "impl": run.impl, "threads": run.threads,
             "host_us": float(np.median(s)) * 1e6, "p90_us": float(np.quantile(s, 0.9)) * 1e6,
             "calls": len(s)} for run, s in zip(runs, samples)]


def set_threads(n: int, torch: Any) -> bool:
    import numba

    if n > numba.config.NUMBA_NUM_THREADS:
        print(f"# skipping threads={n}: Numba was started with NUMBA_NUM_THREADS="
              f"{numba.config.NUMBA_NUM_THREADS}; run with NUMBA_NUM_THREADS={n} to time it",
              flush=True)
        return False
    numba.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)
    return True


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch = None
    if args.torch:
        try:
            import torch
        except ImportError:
            print("# torch is not installed: no torch rows (pip install torch to compare)")
    n = args.numel
    data = host_data(n)
    impl = kernels.implementation(data["g32"])
    print(f"# AMP kernels, n={n} elements, CPU kernels: {impl}, repeats={args.repeats}")
    table = Table([("case", 16, "s"), ("impl", 6, "s"), ("threads", 7, "s"),
                   ("median(ms)", 10, ".3f"), ("min(ms)", 9, ".3f"), ("GB/s", 7, ".2f"),
                   ("vs numpy", 8, ".2f"), ("vs torch", 8, ".2f"), ("exact", 5, "s")])
    print(table.header(), flush=True)
    rows: list[dict] = []
    groups: list[list[Run]] = []
    for threads in args.threads:
        if set_threads(threads, torch):
            groups.append(cpu_runs(data, threads, torch))
    if args.gpu and backend.gpu_available():
        import cupy as cp

        if kernels.implementation(cp.zeros(1, cp.float32)) == "numba-cuda":
            groups.append(gpu_runs(data))
        else:
            print("# GPU found but numba.cuda cannot run: no GPU rows")
    for runs in groups:
        if runs and isinstance(runs[0].threads, int):
            set_threads(runs[0].threads, torch)
        group_rows = []
        for run, samples in zip(runs, time_rounds(runs, args.repeats, args.warmup)):
            st = stats(samples)
            nbytes = CASES[run.case] * n
            group_rows.append({"case": run.case, "impl": run.impl, "threads": run.threads,
                               "numel": n, "bytes": nbytes, "exact": run.exact, **st,
                               "GBps": nbytes / (st["median_us"] * 1e3)})
        base = {r["case"]: r["median_us"] for r in group_rows if r["impl"] in ("numpy", "cupy")}
        torch_t = {r["case"]: r["median_us"] for r in group_rows if r["impl"] == "torch"}
        for r in sorted(group_rows, key=lambda r: (list(CASES).index(r["case"]), r["impl"])):
            r["speedup_vs_numpy"] = base[r["case"]] / r["median_us"] if r["case"] in base else None
            r["speedup_vs_torch"] = (torch_t[r["case"]] / r["median_us"]
                                     if r["case"] in torch_t else None)
            print(table.row(r["case"], r["impl"], str(r["threads"]), r["median_us"] / 1e3,
                            r["min_us"] / 1e3, r["GBps"], r["speedup_vs_numpy"],
                            r["speedup_vs_torch"], "yes" if r["exact"] else "NO"), flush=True)
            rows.append(r)
    per_call: list[dict] = []
    if args.per_call_reps > 0:
        set_threads(1, torch)
        print(f"# per call: host time of one call on persistent buffers of "
              f"{args.per_call_numel} elements (median of {args.per_call_reps} calls)")
        small = Table([("case", 16, "s"), ("impl", 6, "s"), ("threads", 7, "s"),
                       ("host us/call", 12, ".2f"), ("p90 us", 8, ".2f")])
        print(small.header(), flush=True)
        blocks = [(per_call_runs(args.per_call_numel, torch), lambda: None)]
        if any(isinstance(r[0].threads, str) for r in groups):
            import cupy as cp

            blocks.append((per_call_runs(args.per_call_numel, None, cp),
                           cp.cuda.get_current_stream().synchronize))
        for runs, sync in blocks:
            for row in time_per_call(runs, args.per_call_reps, sync):
                row["numel"] = args.per_call_numel
                print(small.row(row["case"], row["impl"], str(row["threads"]), row["host_us"],
                                row["p90_us"]), flush=True)
                per_call.append(row)
    result = {"numel": n, "repeats": args.repeats, "cpu_implementation": impl,
              "argv": list(sys.argv[1:] if argv is None else argv),
              "NUMBA_NUM_THREADS": os.environ.get("NUMBA_NUM_THREADS"),
              "machine": machine_info({"torch": getattr(torch, "__version__", None),
                                       "numba": _numba_version()}),
              "rows": rows, "per_call": per_call}
    out = write_json(args.out / f"{args.name}.json", result)
    print(f"# wrote {shown(out)}")
    if args.plot:
        png = plot(result, args.out / f"{args.name}.png")
        print(f"# wrote {shown(png)}" if png else "# matplotlib is not importable: no plot "
              "(pip install matplotlib)")
    return result


def _numba_version() -> str | None:
    try:
        import numba
    except ImportError:
        return None
    return numba.__version__


def markdown(result: dict) -> str:
    """The result as a Markdown table (the one in docs/benchmarks.md)."""
    lines = ["| case | impl | threads | median (ms) | min (ms) | GB/s (median) | vs numpy | "
             "vs torch | exact |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ratio = lambda v: f"{v:.2f}x" if v is not None else "-"  # noqa: E731
        lines.append(f"| {r['case']} | {r['impl']} | {r['threads']} | "
                     f"{r['median_us'] / 1e3:.2f} | {r['min_us'] / 1e3:.2f} | {r['GBps']:.1f} | "
                     f"{ratio(r['speedup_vs_numpy'])} | {ratio(r['speedup_vs_torch'])} | "
                     f"{'yes' if r['exact'] else 'NO'} |")
    if result.get("per_call"):
        lines += ["", f"| per call ({result['per_call'][0]['numel']} elements) | impl | "
                  "threads | host us/call (median) | p90 us |", "|---|---|---|---|---|"]
        lines += [f"| {r['case']} | {r['impl']} | {r['threads']} | {r['host_us']:.2f} | "
                  f"{r['p90_us']:.2f} |" for r in result["per_call"]]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path | None:
    """GB/s per case, one bar per (impl, threads) (None without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cases = list(CASES)
    series = list(dict.fromkeys((r["impl"], str(r["threads"])) for r in result["rows"]))
    by = {(r["case"], r["impl"], str(r["threads"])): r["GBps"] for r in result["rows"]}
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(series), 1)
    for k, (impl, threads) in enumerate(series):
        xs = [c + k * width for c in range(len(cases))]
        ax.bar(xs, [by.get((case, impl, threads), 0.0) for case in cases], width,
               label=f"{impl} ({threads} thr)" if threads != "gpu" else f"{impl} (gpu)")
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))], cases)
    ax.set_ylabel("GB/s (bytes read + written / median time)")
    ax.set_title(f"AMP kernels, {result['numel']} elements")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
