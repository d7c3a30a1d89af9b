"""Compare a from_torch pair's loss trajectories, torch's against minidist's, over seeds.

    .venv/bin/python examples/from_torch/compare_losses.py word_lm --seeds 0 1 2 3 4
    .venv/bin/python examples/from_torch/compare_losses.py resnet_cnn --seeds 0 1 2 3 4
    .venv/bin/python examples/from_torch/compare_losses.py gan_dcgan --seeds 0 1 2
    .venv/bin/python examples/from_torch/compare_losses.py moco_spawn --seeds 0 1 2

Runs the original under torchrun and the port under ``python -m minidist.launch`` (the
``mp.spawn``-shaped pair, ``moco_spawn``, as plain scripts that start their own two ranks on
a free ``PORT``), both at two ranks, once per seed (``SEED``: the scripts seed their weights
and dropout with it; the two libraries draw different numbers from the same seed, so a seed
is a different initialization in each). Prints, per reported step, the mean and the range
over seeds for each, and ``within``: whether minidist's mean lies inside torch's range over
seeds widened by that range's width on each side, i.e. whether the two differ by no more than
seeds of one library differ among themselves. Writes the numbers to ``--json`` and each
run's output to ``--logs`` (``<library>-seed<k>.txt``) if given. Needs torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATTERNS = {"word_lm": r"epoch (\d+): loss ([0-9.]+)", "resnet_cnn": r"step (\d+): loss ([0-9.]+)",
            "gan_dcgan": r"step (\d+): d_loss ([0-9.]+)",
            "moco_spawn": r"step (\d+): loss ([0-9.]+)"}
SPAWNED = {"moco_spawn"}  # mp.spawn-shaped: the script starts its ranks itself


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TORCH_EXIT_ABORT = "terminate called without an active exception"  # torch's gloo at exit
TORCH_EXIT_RETRIES = 3  # tries after the first, for torch's runs only


def run(pair: str, library: str, seed: int, env_extra: dict[str, str],
        logs: Path | None = None) -> dict[int, float]:
    """One two-rank run; returns {step or epoch: loss} as rank 0 printed them (and writes
    what it printed to ``logs/<library>-seed<seed>.txt`` if ``logs`` is given)."""
    env = dict(os.environ, SEED=str(seed), OMP_NUM_THREADS="1", **env_extra)
    env.pop("MINIDIST_LAUNCHER", None)
    if pair in SPAWNED:
        env["PORT"] = str(free_port())
        cmd = [sys.executable, str(HERE / (f"{pair}.py" if library == "torch"
                                           else f"{pair}_minidist.py"))]
    elif library == "torch":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(HERE / f"{pair}.py")]
    else:
        cmd = [sys.executable, "-m", "minidist.launch", "--standalone", "--nproc-per-node", "2",
               str(HERE / f"{pair}_minidist.py")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for _ in range(TORCH_EXIT_RETRIES if library == "torch" else 0):
        if out.returncode == 0 or TORCH_EXIT_ABORT not in out.stderr:
            break
        # torch's gloo now and then aborts a rank in its teardown, after the script finished
        # (a race between the ranks' exits): torch's reference run is retried, never ours
        if pair in SPAWNED:
            env["PORT"] = str(free_port())
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{library}-seed{seed}.txt").write_text(out.stdout)
    return {int(s): float(v) for s, v in re.findall(PATTERNS[pair], out.stdout)}


def compare(pair: str, seeds: list[int], env_extra: dict[str, str],
            logs: Path | None = None) -> list[dict]:
    """Per reported step: each library's mean and range over ``seeds``, and ``within``."""
    runs = {lib: [run(pair, lib, s, env_extra, logs) for s in seeds]
            for lib in ("torch", "minidist")}
    rows = []
    for step in sorted(runs["torch"][0]):
        t = [r[step] for r in runs["torch"]]
        m = [r[step] for r in runs["minidist"]]
        width = max(t) - min(t)
        mean_m = sum(m) / len(m)
        rows.append({"step": step, "torch_mean": sum(t) / len(t), "torch_min": min(t),
                     "torch_max": max(t), "minidist_mean": mean_m, "minidist_min": min(m),
                     "minidist_max": max(m),
                     "within": min(t) - width <= mean_m <= max(t) + width})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pair", choices=sorted(PATTERNS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--logs", type=Path, help="write each run's output into this folder")
    args = p.parse_args()
    extra = {}
    if args.pair == "word_lm":  # where its torch.save(model) writes
        extra = {"SAVE_TO": str(Path(os.environ.get("TMPDIR", "/tmp")) / "word_lm_cmp.pt")}
    rows = compare(args.pair, args.seeds, extra, args.logs)
    print(f"# {args.pair}, seeds {args.seeds}: loss mean [min, max] over seeds")
    print(f"# {'step':>5}  {'torch':>24}  {'minidist':>24}  within")
    for r in rows:
        print(f"  {r['step']:>5}  {r['torch_mean']:.4f} [{r['torch_min']:.4f}, "
              f"{r['torch_max']:.4f}]  {r['minidist_mean']:.4f} [{r['minidist_min']:.4f}, "
              f"{r['minidist_max']:.4f}]  {r['within']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"pair": args.pair, "seeds": args.seeds,
                                               "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
