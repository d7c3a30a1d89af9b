"""Draw one DDP step from a real step timeline: compute and communication lanes per rank.

    MINIDIST_TRACE=runs/trace ./mpirun.sh -n 2 python examples/train.py --epochs 1
    .venv/bin/python benchmarks/plot_trace.py runs/trace        # -> runs/bench/ddp_step_trace.png

    .venv/bin/python benchmarks/ddp_scaling.py --sizes 2 --quick --rounds 1 --trace /tmp/tr
    .venv/bin/python benchmarks/plot_trace.py /tmp/tr/n2/trace.json \
        --out docs/img/ddp_step_trace.png

The input is a step timeline (minidist/tracing.py): a trace folder (its merged ``trace.json``,
or its ``trace-rank<r>.json`` files merged on the fly) or one such JSON file. A training
run's trace (``MINIDIST_TRACE``, ``TrainerConfig(trace_dir=...)``) gives one panel: the step
of median duration on rank 0, leaving out the first step (it includes compiling and first
touches), beside the same step of every other rank. A trace of
``ddp_scaling.py --trace`` holds several configurations: one panel for overlap on and one for
overlap off, among the timed steps of the "large" model (``--model``), each rank-0 step of
median duration with the step of every other rank that overlaps it most, on one time axis::

    rank 0 compute        [forward][backward......[wait]][opt]
    rank 0 communication              [bucket 0][bucket 1]
    rank 1 ...

"wait" is the exposed communication: backward is done, the all-reduces are not. Needs
matplotlib (``pip install "minidist[bench]"``); without it the script says so and exits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer.step": "#55a868",
          "wait for all-reduce": "#c44e52", "all_reduce": "#8172b3"}


def spans(events: list, pid: int, name: str) -> list:
    return [e for e in events if e.get("ph") == "X" and e["pid"] == pid
            and (e["name"] == name or e["name"].startswith(name + " "))]


def is_step(e: dict) -> bool:
    return e.get("ph") == "X" and e["name"].startswith("step ")


def from_ddp_scaling(events: list) -> bool:
    """True for a ``ddp_scaling.py --trace`` trace (its steps name their configuration)."""
    return any(is_step(e) and "model" in e.get("args", {}) for e in events)


def config_step(model: str, overlap: bool) -> Callable[[dict], bool]:
    """A timed DDP step of one ``ddp_scaling.py`` configuration."""
    def matches(e: dict) -> bool:
        a = e.get("args", {})
        return (is_step(e) and a.get("model") == model and bool(a.get("ddp"))
                and a.get("overlap") == overlap and "bucket_cap_mb" not in a and a["i"] >= 1)
    return matches


def training_step(e: dict) -> bool:
    """A step of a training run's trace, after its first (compiling, first touches)."""
    return is_step(e) and e.get("args", {}).get("step", 0) >= 1


def pick_steps(events: list, matches: Callable[[dict], bool], what: str) -> dict:
    """{pid: step span}: rank 0's median step among those ``matches`` accepts, and the other
    ranks' steps that overlap it most."""
    pids = sorted({e["pid"] for e in events})
    mine = sorted((e for e in events if e["pid"] == pids[0] and matches(e)),
                  key=lambda e: e["dur"])
    if not mine:
        raise SystemExit(f"plot_trace: no {what} in the trace; record one with "
                         "MINIDIST_TRACE=dir (a training run of two steps or more) or "
                         "benchmarks/ddp_scaling.py --trace dir.")
    ref = mine[len(mine) // 2]
    chosen = {pids[0]: ref}
    for pid in pids[1:]:
        cands = [e for e in events if e["pid"] == pid and matches(e)]
        if not cands:
            continue
        chosen[pid] = max(cands, key=lambda e: min(e["ts"] + e["dur"], ref["ts"] + ref["dur"])
                          - max(e["ts"], ref["ts"]))
    return chosen


def draw(ax, events: list, steps: dict, title: str) -> None:
    t0 = min(s["ts"] for s in steps.values())
    t1 = max(s["ts"] + s["dur"] for s in steps.values())
    for pid, s in steps.items():  # every bar drawn ends inside the axes (optimizer.step too)
        t1 = max([t1] + [e["ts"] + e["dur"] for n in COLORS for e in spans(events, pid, n)
                         if s["ts"] - 1 <= e["ts"] <= s["ts"] + s["dur"] + 1])
    rows = []
    for pid in sorted(steps):
        lo, hi = steps[pid]["ts"], steps[pid]["ts"] + steps[pid]["dur"]

        def inside(e: dict, lo: float = lo, hi: float = hi) -> bool:
            return e["ts"] >= lo - 1 and e["ts"] + e.get("dur", 0) <= hi + 1
        y_comp, y_comm = len(rows) * 1.0, len(rows) * 1.0 + 1.0
        rows += [f"rank {pid} compute", f"rank {pid} communication"]
        for name in ("forward", "backward", "optimizer.step", "wait for all-reduce"):
            for e in filter(inside, spans(events, pid, name)):
                h = 0.35 if name == "wait for all-reduce" else 0.7
                ax.barh(y_comp, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=h,
                        color=COLORS[name], hatch="//" if h < 0.7 else None,
                        edgecolor="white", linewidth=0.5)
        for e in filter(inside, spans(events, pid, "all_reduce")):
            ax.barh(y_comm, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.7,
                    color=COLORS["all_reduce"], edgecolor="white", linewidth=0.8)
            a = e["args"]
            label = (f"b{a.get('bucket', '?')} {a['algorithm']} {a['bytes'] / 2**20:.1f} MiB\n"
                     f"{a['busbw_GBps']:.1f} GB/s")
            x_mid = (e["ts"] - t0 + e["dur"] / 2) / 1e3
            if e["dur"] / (t1 - t0) > 0.08:
                ax.text(x_mid, y_comm, label, ha="center", va="center", fontsize=7,
                        color="white")
            else:  # too narrow for the label inside: its bucket number just below the bar
                ax.text(x_mid, y_comm + 0.36, f"b{a.get('bucket', '?')}", ha="center",
                        va="top", fontsize=7, color="#3b3366")
        for e in events:
            if (e.get("ph") == "i" and e["pid"] == pid and e["name"].endswith(" ready")
                    and inside(e)):
                ax.plot((e["ts"] - t0) / 1e3, y_comp + 0.42, marker="v", color="black",
                        markersize=4)
        got = {n: sum(e["dur"] for e in filter(inside, spans(events, pid, n))) / 1e3
               for n in COLORS}
        print(f"# {title}: rank {pid}: " + ", ".join(f"{n} {v:.2f} ms" for n, v in got.items()))
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1e3 * 1.02)
    ax.set_xlabel("ms from the start of the step")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def load_events(path: Path) -> list:
    """The events of a trace file, or of a trace folder (its ``trace.json``, else its per-rank
    files merged here); one line and exit 2 when it holds none."""
    if path.is_dir():
        merged = path / "trace.json"
        files = [merged] if merged.exists() else sorted(path.glob("trace-rank*.json"))
        if not files:
            raise SystemExit(f"plot_trace: {path} holds no trace.json or trace-rank*.json; "
                             f"record one with MINIDIST_TRACE={path}")
    elif path.exists():
        files = [path]
    else:
        raise SystemExit(f"plot_trace: {path} does not exist")
    events: list = []
    for f in files:
        try:
            events += json.loads(f.read_text())["traceEvents"]
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"plot_trace: {f} is not a step timeline (Chrome-trace JSON with "
                             "traceEvents, as minidist/tracing.py writes)") from None
    return events


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a trace folder (MINIDIST_TRACE=dir) or its trace.json, or "
                                 "the merged trace.json of ddp_scaling.py --trace")
    p.add_argument("--out", default="runs/bench/ddp_step_trace.png",
                   help="the PNG (default runs/bench/, git-ignored; the docs' picture: "
                        "--out docs/img/ddp_step_trace.png)")
    p.add_argument("--model", default="large", choices=["small", "large"],
                   help="which model of a ddp_scaling.py trace (default large)")
    args = p.parse_args()
    events = load_events(Path(args.trace))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        print("plot_trace: matplotlib is not installed (pip install \"minidist[bench]\"); "
              "no picture drawn.")
        return
    n = len({e["pid"] for e in events if e.get("ph") != "M"})
    if from_ddp_scaling(events):
        panels = [(config_step(args.model, overlap),
                   f"timed step of model={args.model!r} overlap={overlap}",
                   f"one DDP step, model '{args.model}', n={n}, "
                   f"overlap={'on' if overlap else 'off'}") for overlap in (True, False)]
    else:
        panels = [(training_step, "step after the first", f"one training step, n={n}")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.2 + 1.1 * n * len(panels)),
                             constrained_layout=True, squeeze=False)
    for ax, (matches, what, title) in zip(axes[:, 0], panels):
        steps = pick_steps(events, matches, what)
        ms = statistics.median(s["dur"] for s in steps.values()) / 1e3
        draw(ax, events, steps, f"{title} (step {ms:.1f} ms)")
    handles = [Patch(color=c, label=k.replace("all_reduce", "all-reduce of a bucket"))
               for k, c in COLORS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=8)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
