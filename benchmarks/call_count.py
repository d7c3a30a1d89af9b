"""How many Python-level calls one small ``md.all_reduce`` makes: the library's cost per call.

    .venv/bin/python benchmarks/call_count.py                 # driver: launches n=2 itself
    .venv/bin/python benchmarks/call_count.py --bytes 1024 --calls 2000
    .venv/bin/python benchmarks/call_count.py --algorithm mpi   # MPI's Allreduce, guarded
    .venv/bin/python benchmarks/call_count.py --stages        # what each part of it costs

What it counts: ``cProfile`` over ``--calls`` calls of ``md.all_reduce`` on a float32 buffer of
``--bytes`` bytes, the default group over MPI at n=2 (``mpiexec -n 2`` from the venv), with the
defaults (ledger on, ``algorithm="auto"``: on one node the shared-memory mailboxes; or
``--algorithm``), after 200 warm-up calls. Every function call counts, Python's and C's
(``hash``, ``perf_counter``, a ``deque.append``), as cProfile sees them.

A wait for the peer is not the library's path but the machine's load: on a busy machine a
rank spins in the deadline-bounded wait (``wait_until``: ``Test``, yield, the poll hook), and
those calls grow with the load. They are printed apart ("waiting"), and the count that matters
is the rest ("per call"). Rank 0 prints the table: per function, calls per all_reduce.

``--stages`` times the parts of the same call instead (microseconds per call, the median of
7 tight loops of ``--calls`` calls, rank 0; both ranks call in step): MPI's own blocking
``Allreduce`` (mpi4py, the floor), the ``Iallreduce`` + ``Test`` that a deadline needs, the
plan's run without and with the fingerprint guard, the group's validation and plan (a lookup
for a call like an earlier one), the call numbering with its ledger row, and the whole
``group.all_reduce`` and ``md.all_reduce``.
What a part costs is what the whole call saves without it.

Output: a table on stdout and ``call_count.json`` (``call_stages.json``) in ``--out`` (default
runs/bench/, git-ignored).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the functions of a wait for the peer (their calls measure the load, not the path)
WAITING = ("wait_until", "_wait", "_spin", "sched_yield", "monotonic", "poll", "_poll",
           "sleep")


def label(key: tuple) -> str:
    """``file:line(function)`` of a cProfile key, with the repository's path left out."""
    path, line, name = key
    path = path.replace(str(REPO) + os.sep, "")
    return f"{path}:{line}({name})" if line else name


def profile(nbytes: int, calls: int, algorithm: str = "auto") -> dict:
    """This rank's counts (run under mpiexec)."""
    import numpy as np

    import minidist as md

    md.init_process_group()
    x = np.ones(max(1, nbytes // 4), np.float32)
    for _ in range(200):
        md.all_reduce(x, algorithm=algorithm)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        md.all_reduce(x, algorithm=algorithm)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    # a wait's functions, and every function called only from inside a wait
    wait_keys = {k for k in stats if k[2].rsplit(".", 1)[-1].rstrip(">") in WAITING}
    grew = True
    while grew:
        before = len(wait_keys)
        wait_keys |= {k for k, v in stats.items() if v[4] and set(v[4]) <= wait_keys}
        grew = len(wait_keys) > before
    path: dict[str, float] = {}
    waiting: dict[str, float] = {}
    for key, v in stats.items():
        if "disable" in key[2]:
            continue
        if key in wait_keys:
            waiting[label(key)] = v[1] / calls
            continue
        # a function of the path that a wait calls too (``id`` in the failure poll): the
        # calls made from inside the wait are the wait's
        in_waits = sum(c[1] for caller, c in v[4].items() if caller in wait_keys)
        path[label(key)] = (v[1] - in_waits) / calls
        if in_waits:
            waiting[label(key)] = in_waits / calls
    algorithm = md.comm.get_default_group().plan_all_reduce(x, algorithm).algorithm
    out = {"rank": md.get_rank(), "world_size": md.get_world_size(), "nbytes": x.nbytes,
           "calls": calls, "algorithm": algorithm, "per_call": round(sum(path.values()), 3),
           "waiting": round(sum(waiting.values()), 3), "functions": path}
    md.destroy_process_group()
    return out


def stages(nbytes: int, calls: int, algorithm: str = "auto") -> dict:
    """This rank's time per call of each part of a small all-reduce (run under mpiexec)."""
    import time

    import numpy as np

    import minidist as md

    group = md.init_process_group()
    comm, mpi = group.transport.comm, group.transport.MPI
    x = np.ones(max(1, nbytes // 4), np.float32)
    for _ in range(200):
        md.all_reduce(x, algorithm=algorithm)
    flat, op, stream, plan = group._planned(x, "sum", algorithm, 0)
    probe = group.calls.begin(plan.spec, stream, x.shape)
    group.calls.end(probe)

    def iallreduce() -> None:
        req = comm.Iallreduce(mpi.IN_PLACE, x, op=mpi.SUM)
        while not req.Test():
            pass

    def numbered() -> None:  # every rank calls begin alike: the call numbers stay in step
        group.calls.end(group.calls.begin(plan.spec, stream, x.shape))

    parts = {
        "MPI Allreduce (mpi4py, blocking)": lambda: comm.Allreduce(mpi.IN_PLACE, x, op=mpi.SUM),
        "MPI Iallreduce + Test loop": iallreduce,
        f"plan.run ({plan.algorithm}), no guard": lambda: plan.run(flat, op, 0),
        f"plan.run ({plan.algorithm}), with the guard": lambda: plan.run(flat, op, probe.tag),
        "validate and plan, a known call (_planned)": lambda: group._planned(x, "sum",
                                                                            algorithm, 0),
        "number, tag, ledger row (calls.begin + end)": numbered,
        "group.all_reduce": lambda: group.all_reduce(x, algorithm=algorithm),
        "md.all_reduce": lambda: md.all_reduce(x, algorithm=algorithm),
    }
    us = {}
    for name, fn in parts.items():
        loops = []
        for _ in range(7):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            loops.append((time.perf_counter() - t0) / calls * 1e6)
        us[name] = round(sorted(loops)[3], 3)
    out = {"rank": group.rank, "world_size": group.size, "nbytes": x.nbytes,
           "algorithm": plan.algorithm, "calls": calls, "us": us}
    md.destroy_process_group()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=8, help="buffer size (default 8)")
    p.add_argument("--calls", type=int, default=1000, help="profiled calls (default 1000)")
    p.add_argument("--out", default=str(REPO / "runs" / "bench"), help="where the JSON goes")
    p.add_argument("--algorithm", default="auto", help="what all_reduce runs (default auto)")
    p.add_argument("--stages", action="store_true",
                   help="time the parts of one call instead of counting its calls")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # under mpiexec
    args = p.parse_args()
    if args.rank:
        result = (stages if args.stages else profile)(args.bytes, args.calls, args.algorithm)
        if result["rank"] == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    job = subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, "--rank",
                          "--bytes", str(args.bytes), "--calls", str(args.calls),
                          "--algorithm", args.algorithm]
                         + (["--stages"] if args.stages else []),
                         capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in job.stdout.splitlines() if ln.startswith("RESULT ")]
    if job.returncode != 0 or not lines:
        sys.exit(f"the profiled job failed ({job.returncode}):\n{job.stderr[-3000:]}")
    result = json.loads(lines[0][len("RESULT "):])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.stages:
        print(f"# the parts of one all_reduce of {result['nbytes']} B at "
              f"n={result['world_size']} over MPI (ran {result['algorithm']!r}): us per call, "
              f"median of 7 loops of {result['calls']} calls, rank 0")
        for name, us in result["us"].items():
            print(f"{us:8.2f}  {name}")
        (out / "call_stages.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"# wrote {out / 'call_stages.json'}")
        return
    print(f"# md.all_reduce of {result['nbytes']} B at n={result['world_size']} over MPI "
          f"(ran {result['algorithm']!r}), cProfile over {result['calls']} calls, rank 0")
    print(f"# per call: {result['per_call']:.1f} calls; waiting for the peer: "
          f"{result['waiting']:.1f} more (the machine's load)")
    for name, n in sorted(result["functions"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:8.2f}  {name}")
    (out / "call_count.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"# wrote {out / 'call_count.json'}")


if __name__ == "__main__":
    main()
