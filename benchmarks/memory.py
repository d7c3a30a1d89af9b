"""Memory per rank: plain DDP vs activation checkpointing vs ZeRO-1 vs both, at n = 1, 2, 4.

    .venv/bin/python benchmarks/memory.py                     # driver: launches n = 1, 2, 4 itself
    ./mpirun.sh -n 2 python benchmarks/memory.py    # one world size, table for that n
    .venv/bin/python benchmarks/memory.py --sizes 2 --steps 3 --rounds 1     # a faster look

Models (float32, AdamW, synthetic data, batch 256 PER RANK), each a stem, 6 residual-free
transformer-style MLP blocks (width -> 4 x width -> GELU -> width) and a head:
    mlp      width 64   (0.21M parameters)
    mlp10x   width 200  (1.94M parameters, ~10x)

Modes: "ddp" (DistributedDataParallel + AdamW), "ckpt" (every block checkpointed with
minidist.utils.checkpoint_sequential), "zero" (ZeroRedundancyOptimizer(AdamW) over the DDP
buckets), "zero+ckpt" (both). Per rank, from minidist.utils.memory_report: parameters,
gradients that own their memory, bucket buffers (+ ZeRO's shard buffers), optimizer state
(AdamW's exp_avg + exp_avg_sq; ZeRO: this rank's shard), and, under tracemalloc, the
activations still held for backward when forward has returned ("act kept") and the peak
through forward + backward ("peak act": kept activations + backward's temporaries + the one
block a checkpointed backward recomputes). Columns are the max over ranks. Step time: forward, backward (with the bucket
reductions), optimizer step, zero_grad; the median over ``--rounds`` rounds in which the four
modes take turns (so machine noise hits them alike), each round the median of ``--steps``
steps after warm-up.

Output: the table on stdout (rank 0); the driver writes memory.json and memory.txt into
``--out`` (default runs/bench/, git-ignored; the published results in benchmarks/results/ come
from ``--out benchmarks/results``); a single launch under mpirun.sh writes memory_nN.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import minidist  # noqa: E402
from _common import LOCAL_RESULTS, Table, machine_info, shown, write_json  # noqa: E402
from minidist import comm, nn, optim  # noqa: E402
from minidist.ddp import DistributedDataParallel, ZeroRedundancyOptimizer  # noqa: E402
from minidist.tensor import Tensor  # noqa: E402
from minidist.utils import checkpoint_sequential, memory_report  # noqa: E402

MODELS = {"mlp": 64, "mlp10x": 200}
MODES = ["ddp", "ckpt", "zero", "zero+ckpt"]
D_IN, D_OUT, BLOCKS, BATCH = 64, 10, 6, 256
MiB = float(1 << 20)


class BlockMLP(nn.Module):
    """stem -> BLOCKS x (Linear w->4w, GELU, Linear 4w->w) -> head; optionally checkpointed."""

    def __init__(self, width: int, checkpointed: bool) -> None:
        super().__init__()
        minidist.manual_seed(0)
        self.stem = nn.Linear(D_IN, width)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                                    nn.Linear(4 * width, width))
                                      for _ in range(BLOCKS)])
        self.head = nn.Linear(width, D_OUT)
        self.checkpointed = checkpointed

    def forward(self, x: Tensor) -> Tensor:
        h = self.stem(x)
        h = checkpoint_sequential(self.blocks, BLOCKS, h) if self.checkpointed else self.blocks(h)
        return self.head(h)


class Setup:
    def __init__(self, model_name: str, mode: str) -> None:
        self.model = BlockMLP(MODELS[model_name], "ckpt" in mode)
        self.ddp = DistributedDataParallel(self.model)
        if "zero" in mode:
            self.opt = ZeroRedundancyOptimizer(self.model.parameters(), optim.AdamW,
                                               ddp=self.ddp, lr=1e-3)
        else:
            self.opt = optim.AdamW(self.model.parameters(), lr=1e-3)
        rng = np.random.default_rng(comm.get_rank())
        self.x = Tensor(rng.normal(size=(BATCH, D_IN)).astype(np.float32))
        self.y = rng.integers(0, D_OUT, size=BATCH)
        self.loss_fn = nn.CrossEntropyLoss()

    def forward(self) -> Tensor:
        return self.loss_fn(self.ddp(self.x), self.y)

    def step(self) -> None:
        self.forward().backward()
        self.opt.step()
        self.opt.zero_grad()


def run_size(args: argparse.Namespace) -> dict:
    rank, world = comm.get_rank(), comm.get_world_size()
    rows = []
    for model_name in args.models:
        setups = {mode: Setup(model_name, mode) for mode in MODES}
        times: dict[str, list[float]] = {m: [] for m in MODES}
        for s in setups.values():
            for _ in range(args.warmup):
                s.step()
        for _ in range(args.rounds):
            for mode, s in setups.items():
                comm.barrier()
                samples = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    s.step()
                    samples.append(time.perf_counter() - t0)
                times[mode].append(statistics.median(samples))
        for mode, s in setups.items():
            comm.barrier()
            rep = memory_report(s.ddp, s.opt, step=s.forward)
            s.opt.step()  # ZeRO: the synced backward above is consumed
            s.opt.zero_grad()
            every = comm.all_gather_object(rep.as_dict())
            step_ms = statistics.median(times[mode]) * 1e3
            all_ms = comm.all_gather_object(step_ms)
            row = {"model": model_name, "n": world, "mode": mode,
                   "params": sum(p.data.size for p in s.model.parameters()),
                   "step_ms": max(all_ms)}
            for key in ("parameters", "gradients", "buckets", "optimizer_state",
                        "activations_kept", "peak_activations"):
                row[key + "_mib"] = max(r[key] for r in every) / MiB
            rows.append(row)
            s.ddp.close(release_buffers=True)
    command = (f"./mpirun.sh -n {world} python benchmarks/memory.py --steps {args.steps} "
               f"--rounds {args.rounds} --warmup {args.warmup} --models {' '.join(args.models)}")
    return {"world_size": world, "rows": rows, "machine": machine_info(),
            "command": command} if rank == 0 else {}


TABLE = Table([("model", 7, "s"), ("n", 2, "d"), ("mode", 10, "s"), ("params", 6, ".2f"),
               ("grads", 6, ".2f"), ("buckets", 7, ".2f"), ("opt state", 9, ".3f"),
               ("act kept", 8, ".2f"), ("peak act", 8, ".2f"), ("step ms", 8, ".1f")])


def render(rows: list[dict]) -> str:
    lines = ["# memory per rank in MiB (max over ranks); act kept = held for backward after "
             "forward; peak act = forward+backward peak (tracemalloc)", TABLE.header()]
    for r in rows:
        lines.append(TABLE.row(r["model"], r["n"], r["mode"], r["parameters_mib"],
                               r["gradients_mib"], r["buckets_mib"], r["optimizer_state_mib"],
                               r["activations_kept_mib"], r["peak_activations_mib"],
                               r["step_ms"]))
    lines.append("")
    lines.append("# ratios against ddp of the same model and n")
    base = {(r["model"], r["n"]): r for r in rows if r["mode"] == "ddp"}
    for r in rows:
        if r["mode"] == "ddp":
            continue
        b = base[(r["model"], r["n"])]
        lines.append(f"  {r['model']:7s} n={r['n']} {r['mode']:10s} opt state "
                     f"{r['optimizer_state_mib'] / b['optimizer_state_mib']:.3f}x  act kept "
                     f"{r['activations_kept_mib'] / b['activations_kept_mib']:.3f}x  peak act "
                     f"{r['peak_activations_mib'] / b['peak_activations_mib']:.3f}x  step "
                     f"{r['step_ms'] / b['step_ms']:.3f}x")
    return "\n".join(lines)


def driver(args: argparse.Namespace) -> None:
    out = Path(args.out)
    rows = []
    for n in args.sizes:
        cmd = [str(REPO / "mpirun.sh"), "-n", str(n), sys.executable, __file__, "--out", str(out),
               "--steps", str(args.steps), "--rounds", str(args.rounds), "--warmup",
               str(args.warmup), "--models", *args.models]
        subprocess.run(cmd, check=True, timeout=900)
        rows += json.loads((out / f"memory_n{n}.json").read_text())["rows"]
    text = render(rows)
    print(text, flush=True)
    write_json(out / "memory.json", {"rows": rows, "machine": machine_info(),
                                     "command": "python benchmarks/memory.py " +
                                     " ".join(sys.argv[1:])})
    (out / "memory.txt").write_text(text + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=str(LOCAL_RESULTS), help="folder for the JSON/text "
                   "results (the published ones: --out benchmarks/results)")
    args = p.parse_args()
    under_mpi = any(v in os.environ for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "RANK"))
    if not under_mpi:
        driver(args)
        return
    comm.init_process_group()
    res = run_size(args)
    if comm.get_rank() == 0:
        print(render(res["rows"]), flush=True)
        write_json(Path(args.out) / f"memory_n{res['world_size']}.json", res)
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    main()
