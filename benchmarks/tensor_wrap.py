"""The main job's step time before and after a change, measured alternately in one window.

    .venv/bin/python benchmarks/tensor_wrap.py --old <git-ref> [--rounds 6] [--epochs 10]
    # e.g. --old HEAD~1: the commit before the change under test

What it answers: does a change to the tensor layer (here: ``.data`` and ``.grad`` as Tensors
instead of arrays) cost the main job time per step? It checks out ``--old`` into a temporary
git worktree and runs the main job, ``./mpirun.sh -n 4 python examples/train.py``, from the old
tree and from this one in turn (the order flips every round), so a burst of load from other
jobs on a shared machine hits both sides of a round alike. Each run prints its samples/s; the
step time is ``world x batch / samples/s``. Reported: the median step time of each side and
the median of the per-round ratios new/old (1.00 = no change; the target: at most 1.03).

Both sides use this repository's virtual environment; ``PYTHONPATH`` points Python at each
tree's ``minidist`` (checked: each run prints which tree it imported).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import LOCAL_RESULTS, REPO, Table, machine_info, write_json  # noqa: E402

SAMPLES = re.compile(r"final test_acc ([0-9.]+).*?([0-9,]+) samples/s")


def run_job(tree: Path, world: int, epochs: int, batch: int, timeout_s: float) -> dict:
    """One run of the main job with ``tree``'s minidist; samples/s and the step time."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    probe = ("import minidist, pathlib; print('minidist from', "
             "pathlib.Path(minidist.__file__).resolve().parent.parent)")
    where = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", probe], env=env,
                           capture_output=True, text=True, timeout=120, cwd=tree)
    if str(tree.resolve()) not in where.stdout:
        raise SystemExit(f"tensor_wrap: expected minidist from {tree}, got {where.stdout!r} "
                         f"{where.stderr[-500:]!r}")
    cmd = [str(REPO / "mpirun.sh"), "-n", str(world), "python", str(tree / "examples" /
                                                                    "train.py"),
           "--epochs", str(epochs), "--batch-size", str(batch)]
    job = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s,
                         cwd=tree)
    found = SAMPLES.search(job.stdout)
    if job.returncode != 0 or not found:
        raise SystemExit(f"tensor_wrap: the job failed in {tree} (exit {job.returncode}):\n"
                         f"{job.stdout[-2000:]}\n{job.stderr[-2000:]}")
    per_s = float(found.group(2).replace(",", ""))
    return {"test_acc": float(found.group(1)), "samples_per_s": per_s,
            "step_ms": 1000.0 * world * batch / per_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="git ref of the code before the change")
    p.add_argument("--rounds", type=int, default=6, help="old/new pairs (order alternates)")
    p.add_argument("--world", type=int, default=4, help="ranks (the main job: 4)")
    p.add_argument("--epochs", type=int, default=10, help="epochs per run (default 10)")
    p.add_argument("--batch-size", type=int, default=64, help="per rank (train.py's default)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--out", default=str(LOCAL_RESULTS), help="folder for the JSON results")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="tensor_wrap_") as tmp:
        old_tree = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old_tree),
                        args.old], check=True, capture_output=True)
        try:
            sides: dict[str, list[dict]] = {"old": [], "new": []}
            ratios = []
            table = Table([("round", 5, "d"), ("first", 5, "s"), ("old ms", 8, ".2f"),
                           ("new ms", 8, ".2f"), ("new/old", 8, ".3f")])
            print(f"# the main job at -n {args.world}, {args.epochs} epochs per run, "
                  f"old = {args.old}, new = this tree; order alternates per round")
            print(table.header())
            for r in range(args.rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                got = {}
                for side in order:
                    tree = old_tree if side == "old" else REPO
                    got[side] = run_job(tree, args.world, args.epochs, args.batch_size,
                                        args.timeout)
                    sides[side].append(got[side])
                ratio = got["new"]["step_ms"] / got["old"]["step_ms"]
                ratios.append(ratio)
                print(table.row(r, order[0], got["old"]["step_ms"], got["new"]["step_ms"],
                                ratio), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(old_tree)], capture_output=True)
    old_ms = statistics.median(s["step_ms"] for s in sides["old"])
    new_ms = statistics.median(s["step_ms"] for s in sides["new"])
    ratio = statistics.median(ratios)
    print(f"# median step: old {old_ms:.2f} ms, new {new_ms:.2f} ms; median of per-round "
          f"new/old {ratio:.3f}x ({(ratio - 1) * 100:+.1f}%)")
    write_json(Path(args.out) / "tensor_wrap.json", {
        "machine": machine_info(), "old": args.old, "world": args.world, "epochs": args.epochs,
        "batch_size": args.batch_size, "runs": sides, "ratios": ratios,
        "median_old_ms": old_ms, "median_new_ms": new_ms, "median_ratio": ratio})


if __name__ == "__main__":
    main()
