"""Draw what a real run of each all-reduce algorithm sent, one panel per logical step.

    .venv/bin/python -m minidist.viz docs/img           # ring/tree/rd/direct at N=4 (+ N=3) and the
                                               # cost-model plot; needs matplotlib
    rec = record("ring", n=4, numel=8)         # run it on 4 thread ranks, recorded
    draw_steps(rec, "ring, N=4", "ring.png")   # ranks on a circle, one arrow per message

Nothing here is drawn by hand: ``record`` runs the library's algorithm over the threads
transport wrapped in a ``RecordingTransport`` and the pictures are the recorded messages.
An arrow's label is the element range of the buffer it carried (``[2:4)``), or ``all`` for
the whole buffer. Without matplotlib the drawing functions raise ``ImportError`` with the fix.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from minidist.comm import ReduceOp
from minidist.comm.algorithms import ALGORITHMS
from minidist.auto.select import predict_us
from minidist.comm.transports.threads import run_threads
from minidist.viz.recorder import Recorder


def record(algorithm: str, n: int, numel: int = 8) -> Recorder:
    """Run ``algorithm`` ("ring", "tree", "rd", "direct") on ``n`` thread ranks, recorded.

    Each rank contributes ``rank + 1`` in every element; the result is checked against the sum.
    """
    fn = ALGORITHMS[algorithm]
    rec = Recorder()

    def body(t: Any) -> None:
        buf = np.full(numel, t.rank + 1, dtype=np.float32)
        fn(rec.wrap(t, watch=buf), buf, ReduceOp.SUM)
        if not np.all(buf == n * (n + 1) / 2):
            raise RuntimeError(f"[rank {t.rank}/{n}] {algorithm}: wrong result {buf}")

    run_threads(n, body, timeout_s=30)
    rec.numel = numel
    return rec


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("minidist.viz draws with matplotlib, which is not installed: "
                          "pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _label(m: Any, numel: int) -> str:
    if m.start is None:
        return f"{m.nbytes} B"
    return "all" if (m.start, m.stop) == (0, numel) else f"[{m.start}:{m.stop})"


def draw_steps(rec: Recorder, title: str, path: str | Path) -> Path:
    """One panel per step: ranks on a circle, an arrow per message labelled with its range."""
    plt = _pyplot()
    n, steps = rec.size, rec.steps()
    cols = min(steps, 6)
    rows = math.ceil(steps / cols)
    size = 2.3 if n <= 4 else 2.9  # more ranks: bigger panels, smaller nodes
    fig, axes = plt.subplots(rows, cols, figsize=(max(size * cols, 7.5),  # room for the title
                                                  (size + 0.2) * rows + 0.4), squeeze=False)
    pos = [(math.sin(2 * math.pi * r / n), math.cos(2 * math.pi * r / n)) for r in range(n)]
    node = 0.22 if n <= 4 else 0.15
    for s, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if s >= steps:
            continue
        ax.set_xlim(-1.45, 1.45)
        ax.set_ylim(-1.45, 1.45)
        ax.set_aspect("equal")
        ax.set_title(f"step {s}", fontsize=10)
        for r, (x, y) in enumerate(pos):
            ax.add_patch(plt.Circle((x, y), node, color="#dde6f5", ec="#345", zorder=2))
            ax.text(x, y, str(r), ha="center", va="center", fontsize=10, zorder=3)
        for m in (m for m in rec.messages if m.step == s):
            (x0, y0), (x1, y1) = pos[m.src], pos[m.dst]
            both = any(o.step == s and o.src == m.dst and o.dst == m.src for o in rec.messages)
            # arc3 bends an arrow by rad/2 of its length towards (dy, -dx); a one-way arrow
            # bends (and is labelled) towards the middle of the circle, away from the other
            # nodes; a two-way pair bends to opposite sides
            mx, my = (x0 + x1) / 2, (y0 + y1) / 2
            dx, dy = y1 - y0, x0 - x1
            length = max(math.hypot(dx, dy), 1e-9)
            rad = 0.25 if both else (0.1 if dx * mx + dy * my <= 0 else -0.1)
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=1, arrowprops=dict(
                arrowstyle="-|>", color="#c33", lw=1.3, shrinkA=node * 60, shrinkB=node * 60,
                connectionstyle=f"arc3,rad={rad}"))
            k = (rad / 2 * length + math.copysign(0.13, rad)) / length  # on a white ground
            ax.text(mx + dx * k, my + dy * k, _label(m, rec.numel), fontsize=8, ha="center",
                    va="center", color="#822", zorder=4,
                    bbox=dict(boxstyle="round,pad=0.12", fc="white", ec="none", alpha=0.9))
    per_rank = max(len(rec.sent_by(r)) for r in range(n))
    fig.suptitle(f"{title}: {len(rec.messages)} messages, {steps} steps, at most {per_rank} "
                 f"sent per rank (buffer of {rec.numel} elements)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_cost_model(results_json: str | Path, path: str | Path) -> Path:
    """Measured medians of ``benchmarks/allreduce.py`` against the fitted alpha-beta model."""
    plt = _pyplot()
    data = json.loads(Path(results_json).read_text())
    n = int(data["n"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, name in enumerate(["ring", "tree", "rd", "direct", "mpi"]):
        rows = sorted((r for r in data["rows"] if r["algorithm"] == name),
                      key=lambda r: r["nbytes"])
        if not rows:
            continue
        color = f"C{i}"
        ks = [r["nbytes"] for r in rows]
        ax.plot(ks, [r["median_us"] for r in rows], "o", color=color, ms=4,
                label=f"{name} measured")
        grid = np.logspace(math.log10(ks[0]), math.log10(ks[-1]), 60)
        ax.plot(grid, [predict_us(name, n, int(k)) for k in grid], "-", color=color, lw=1,
                label=f"{name} model")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size K [bytes]")
    ax.set_ylabel("all-reduce time [us]")
    ax.set_title(f"alpha-beta model vs measured medians, N={n} ({Path(results_json).name})",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
