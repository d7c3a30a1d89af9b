"""The lines one default DDP step executes: how much code a learner really walks.

    .venv/bin/python benchmarks/executed_path.py            # driver: launches n=2 itself
    .venv/bin/python benchmarks/executed_path.py --files    # + the line count of every file
    .venv/bin/python benchmarks/executed_path.py --out benchmarks/results   # published results
                                                            # (default: runs/bench/, git-ignored)

What it measures: ``DDP(model)`` with the DEFAULT settings, over MPI at n=2 (``mpiexec -n 2``
from the venv), a 3-layer MLP (784-1024-1024-10, ReLU) and SGD with momentum. After a few
warm-up steps, five steady-state steps are traced, each on its own, in EVERY thread
(``sys.settrace`` on the main thread, ``threading.settrace`` installed before anything
starts, so the DDP communication thread and any other thread the library starts are traced
too) from ``loss.backward()`` through ``opt.step()``. Counted: the distinct (file, line)
pairs executed inside the ``minidist`` package, and in code it generates at run time (an
optimizer's in-place plan: counted as minidist/optim/inplace.py, which wrote it) ("library
lines"); the forward pass, ``zero_grad`` and the test script itself are not counted.

Which step counts: the one of the five with the fewest lines, per rank. The code of a step
is the same every time, but how long a rank waits for its peer is not: on a loaded machine a
wait outlasts the spin of a shared-memory barrier, and the barrier's slow path runs (yield,
and once in a while ask the failure side channel whether a peer died). Those lines are real
and are printed too ("lines only in steps that waited", the union over the five steps
minus the counted one), but they measure the machine's load, not the path.

Printed per rank: distinct library lines, the number of files, and the share of those lines
in instrumentation modules (anything that watches the core rather than being it: the
diagnosis package, trace, timeline, grad checks, preflight, report and log modules). The
numbers that matter are the max over ranks; ``TARGETS`` are the budget a default step must
meet (tests/test_executed_path.py checks them).

Output: a table on stdout, ``executed_path.json`` (per rank: counts, lines per file, every
executed line) in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from _common import LOCAL_RESULTS, mpiexec_path, shown  # noqa: E402

# The budget of one default step: at most this many distinct lines, files, instrumentation %.
TARGETS = {"lines": 280, "files": 14, "instrumentation_pct": 5.0}
# Modules that observe the core rather than being it (a path part or a module stem).
INSTRUMENTATION_PARTS = {"diagnosis"}
INSTRUMENTATION_STEMS = {"trace", "tracing", "timeline", "nonfinite", "preflight", "report", "log",
                         "logger"}
WARMUP_STEPS = 3
TRACED_STEPS = 5


def is_instrumentation(relpath: str) -> bool:
    """True for a library file (``minidist/...py``) that is instrumentation, not core."""
    p = Path(relpath)
    return bool(INSTRUMENTATION_PARTS & set(p.parts[:-1])) or p.stem in INSTRUMENTATION_STEMS


def wing_of(relpath: str) -> str | None:
    """The wing a library file belongs to (minidist/wings.py's name: "fastpath", "auto", ...;
    "watch" for an observer), or None for the spine."""
    if is_instrumentation(relpath):
        return "watch"
    from minidist.wings import is_wing_module
    return is_wing_module(relpath.removesuffix(".py").replace("/", ".").removesuffix(".__init__"))


def summarize(lines: list[tuple[str, int]]) -> dict:
    """Counts of one rank's executed lines: total, per file, instrumentation share, spine and
    wing lines."""
    per_file: dict[str, int] = {}
    for f, _ in lines:
        per_file[f] = per_file.get(f, 0) + 1
    instr = sum(n for f, n in per_file.items() if is_instrumentation(f))
    wings = {f: w for f in per_file if (w := wing_of(f))}
    total = len(lines)
    return {"lines": total, "files": len(per_file),
            "spine_lines": sum(n for f, n in per_file.items() if f not in wings),
            "wing_lines": sum(n for f, n in per_file.items() if f in wings),
            "wings": dict(sorted(wings.items())),
            "instrumentation_lines": instr,
            "instrumentation_pct": 100.0 * instr / total if total else 0.0,
            "per_file": dict(sorted(per_file.items(), key=lambda kv: (-kv[1], kv[0])))}


def library_file(filename: str) -> str:
    """A traced code object's file, relative to the repository; generated code
    (``<minidist.optim.inplace sgd_momentum>``) counts as the module that generated it."""
    if filename.startswith("<minidist."):
        return filename[1:].split()[0].rstrip(">").replace(".", "/") + ".py"
    return str(Path(filename).relative_to(REPO))


# ---------------------------------------------------------------------------- one rank
def rank_main(out_dir: Path) -> None:
    """One rank: install the tracer in every thread, build, warm up, trace one step."""
    pkg = str(REPO / "minidist") + os.sep
    steps: list[set[tuple[str, int]]] = []  # one set of executed lines per traced step
    recording = threading.Event()

    def local(frame, event, arg):  # noqa: ANN001, ANN202 (the sys.settrace signature)
        if event == "line" and recording.is_set():
            steps[-1].add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def tracer(frame, event, arg):  # noqa: ANN001, ANN202
        # the package's files, and code the library generates at run time (its file name
        # "<minidist...>": an optimizer's traced in-place plan, minidist/optim/inplace.py)
        return local if frame.f_code.co_filename.startswith((pkg, "<minidist")) else None

    # Before any library thread starts: every thread started from now on is traced.
    threading.settrace(tracer)

    import numpy as np

    import minidist
    from minidist import comm, nn, optim
    from minidist.tensor import Tensor

    comm.init_process_group()
    rank = comm.get_rank()
    minidist.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 10))
    ddp = minidist.DistributedDataParallel(model)  # the defaults: nothing passed
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(rank)
    x = Tensor(rng.normal(size=(64, 784)).astype(np.float32))
    y = rng.integers(0, 10, 64)
    for step in range(WARMUP_STEPS + TRACED_STEPS):
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        if step >= WARMUP_STEPS:  # a steady-state step: backward through opt.step()
            steps.append(set())
            sys.settrace(tracer)
            recording.set()
        loss.backward()
        opt.step()
        recording.clear()
        sys.settrace(None)
    threading.settrace(None)  # type: ignore[arg-type]
    comm.barrier()
    rel = [sorted((library_file(f), n) for f, n in lines) for lines in steps]
    (out_dir / f"rank{rank}.json").write_text(json.dumps(rel))
    ddp.close()
    comm.destroy_process_group()


# ---------------------------------------------------------------------------- driver
def measure(n: int = 2, timeout_s: float = 300) -> dict:
    """Launch ``n`` ranks under mpiexec; return {rank: [executed lines of each traced step]}."""
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[k] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        argv = [mpiexec_path(), "-n", str(n), sys.executable, __file__, "--rank-out", tmp]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=str(REPO), start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.communicate()
            raise SystemExit(f"executed_path.py: the n={n} job ran past {timeout_s:.0f} s "
                             "and was killed") from None
        if p.returncode != 0:
            raise SystemExit(f"executed_path.py: the n={n} job failed (exit {p.returncode})\n"
                             f"{out[-3000:]}\n{err[-3000:]}")
        return {r: [[tuple(x) for x in step]
                    for step in json.loads((Path(tmp) / f"rank{r}.json").read_text())]
                for r in range(n)}


def counted_step(steps: list[list[tuple[str, int]]]) -> tuple[list, list]:
    """The step with the fewest lines, and the lines only other steps ran (waits)."""
    best = min(steps, key=len)
    union = set().union(*map(set, steps))
    return best, sorted(union - set(best))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=LOCAL_RESULTS,
                    help="folder for executed_path.json (default: runs/bench/)")
    ap.add_argument("--files", action="store_true", help="print every file's line count")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for the n=2 job")
    ap.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)  # set by the driver
    args = ap.parse_args()
    if args.rank_out is not None:
        rank_main(args.rank_out)
        return
    traced = measure(2, args.timeout)
    by_rank = {r: counted_step(steps)[0] for r, steps in traced.items()}
    waited = {r: counted_step(steps)[1] for r, steps in traced.items()}
    ranks = {r: summarize(lines) for r, lines in by_rank.items()}
    worst = {k: max(s[k] for s in ranks.values()) for k in TARGETS}
    print("# one default DDP(model) step, n=2 over MPI, loss.backward() through opt.step(),"
          f" every thread (the fewest lines of {TRACED_STEPS} steps)")
    print(f"# {'rank':>4} {'lines':>6} {'files':>6} {'instr lines':>12} {'instr %':>8}"
          f"  {'lines only in steps that waited':>32}")
    for r, s in ranks.items():
        print(f"  {r:>4} {s['lines']:>6} {s['files']:>6} {s['instrumentation_lines']:>12} "
              f"{s['instrumentation_pct']:>8.1f}  {len(waited[r]):>32}")
    ok = {k: worst[k] <= TARGETS[k] for k in TARGETS}
    print(f"  {'max':>4} {worst['lines']:>6} {worst['files']:>6} {'':>12} "
          f"{worst['instrumentation_pct']:>8.1f}")
    print(f"  {'goal':>4} {TARGETS['lines']:>6} {TARGETS['files']:>6} {'':>12} "
          f"{TARGETS['instrumentation_pct']:>8.1f}   "
          + ("met" if all(ok.values()) else
             "NOT met: " + ", ".join(k for k, v in ok.items() if not v)))
    s0 = ranks[0]
    print(f"# rank 0: spine {s0['spine_lines']} lines, wings {s0['wing_lines']} lines ("
          + ", ".join(f"{w} {sum(s0['per_file'][f] for f, x in s0['wings'].items() if x == w)}"
                      for w in sorted(set(s0["wings"].values()))) + ")")
    per_file = ranks[0]["per_file"]
    shown_files = per_file if args.files else dict(list(per_file.items())[:10])
    print(f"# rank 0, lines per file ({'all' if args.files else 'largest 10'}; "
          "* = instrumentation, [wing])")
    for f, cnt in shown_files.items():
        wing = wing_of(f)
        print(f"  {cnt:>5}  {f}{'  *' if is_instrumentation(f) else ''}"
              f"{f'  [{wing}]' if wing else ''}")
    extra = sorted({f for lines in waited.values() for f, _ in lines})
    if extra:
        print("# files of the lines only steps that waited ran (any rank): " + ", ".join(extra))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "executed_path.json"
    path.write_text(json.dumps({"targets": TARGETS, "max_over_ranks": worst, "met": ok,
                                "ranks": {str(r): {**s, "executed": by_rank[r],
                                                   "only_in_steps_that_waited": waited[r]}
                                          for r, s in ranks.items()}}, indent=1))
    print(f"# wrote {shown(path)}")


if __name__ == "__main__":
    main()
