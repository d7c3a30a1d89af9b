"""``.venv/bin/python -m minidist.viz [OUT_DIR]``: draw the pictures of docs/algorithms.md.

    .venv/bin/python -m minidist.viz             # into runs/viz/ (git-ignored)
    .venv/bin/python -m minidist.viz docs/img    # regenerate the docs' own pictures
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minidist.viz.render import draw_steps, plot_cost_model, record

PICTURES = [("ring", 4), ("ring", 3), ("tree", 8), ("tree", 3), ("rd", 4), ("rd", 3),
            ("direct", 3)]


def main(argv: list) -> int:
    p = argparse.ArgumentParser(
        prog="python -m minidist.viz",
        description="Draw the step-by-step pictures of each all-reduce algorithm (and the cost "
                    "model beside benchmarks/results/allreduce_n2.json) for docs/algorithms.md. "
                    "Needs matplotlib.")
    p.add_argument("out_dir", nargs="?", default="runs/viz",
                   help="folder for the PNG files (default runs/viz; docs/img regenerates the "
                        "docs' pictures)")
    out = Path(p.parse_args(argv).out_dir)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("minidist.viz: matplotlib is not installed, no pictures drawn "
              "(pip install matplotlib).")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for name, n in PICTURES:
        rec = record(name, n, numel=2 * n if name == "ring" else 8)
        path = draw_steps(rec, f"{name}, N={n}", out / f"algo_{name}_n{n}.png")
        print(f"{path}: {len(rec.messages)} messages in {rec.steps()} steps")
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "allreduce_n2.json"
    if results.exists():
        print(plot_cost_model(results, out / "cost_model_n2.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
