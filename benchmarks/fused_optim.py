"""Optimizer-step benchmark on one CPU thread: minidist's AdamW or SGD (default, fused) beside torch's.

    .venv/bin/python benchmarks/fused_optim.py                        # 10.5M parameters
    .venv/bin/python benchmarks/fused_optim.py --optimizer sgd        # SGD, momentum 0.9
    PYTHONPATH=. /path/to/torch-venv/bin/python benchmarks/fused_optim.py   # + torch's columns
    .venv/bin/python benchmarks/fused_optim.py --numel 1M --repeats 5 --out /tmp/o
    .venv/bin/python benchmarks/fused_optim.py --train-step     # examples/train.py's step, by phase

The model: ``--layers`` square linear layers (weight d x d + bias d), d chosen so the total is
about ``--numel`` (default 10 x 1024 x 1025 = 10,496,000 parameters, 20 tensors), float32.

Implementations (all AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2; with
``--optimizer sgd`` all SGD, lr 1e-3, momentum 0.9, weight_decay 1e-2):

    default  minidist.optim.AdamW: per tensor, whole-array NumPy ops (14 passes over memory)
    fused    minidist.optim.AdamW(fused=True): ONE Numba call for all tensors (a multi-tensor
             table of offsets, minidist.optim.multi_tensor)
    fused-per-tensor
             the same kernel called once per tensor (``fused.MULTI_TENSOR = False``: the path
             before multi-tensor tables)
    torch-foreach / torch-fused
             torch.optim.AdamW(foreach=True) / (fused=True), torch.set_num_threads(1)

GB/s counts the bytes one fused pass must move: AdamW reads p, g, m, v and writes p, m, v
(28 bytes per float32 parameter), SGD with momentum reads p, g, buf and writes p, buf (20).

Method: first every implementation runs ``--check-steps`` steps from the same parameters with
the same gradients, and the result is compared with torch's fused AdamW (max |difference|;
``fused`` also bit for bit with ``default``). Then ``--repeats`` rounds; in each round every
implementation runs one step, in a random order (seeded by the round), so load drift on a
shared machine hits all alike. Reported: median time per step, and ratios to the fastest
torch step of the same run. Without torch the torch columns are left out (one line says so).
Output: a table on stdout and ``fused_optim.json`` in ``--out`` (default runs/bench/).

``--train-step`` instead times one step of examples/train.py's default model (MLP
64-512-256-10 with dropout, batch 16, one BLAS thread) phase by phase: forward, forward +
loss + backward, and the AdamW step default and fused (``train_step.json``).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # one thread, like torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import LOCAL_RESULTS, Table, machine_info, parse_bytes, shown, stats, write_json  # noqa: E402

from minidist import optim  # noqa: E402
from minidist.nn import Parameter  # noqa: E402
from minidist.optim import fused  # noqa: E402

HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
OPTIMIZERS = {  # --optimizer: (class name in minidist.optim and torch.optim, options, bytes)
    "adamw": ("AdamW", HYPER, 28),
    "sgd": ("SGD", dict(lr=1e-3, momentum=0.9, weight_decay=1e-2), 20),
}


def shapes_for(numel: int, layers: int) -> list[tuple[int, ...]]:
    d = max(1, int(round((math.sqrt(1 + 4 * numel / layers) - 1) / 2)))  # d*d + d ~ numel/layers
    return [s for _ in range(layers) for s in ((d, d), (d,))]


def make_data(shapes: list[tuple[int, ...]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(np.float32) * 0.02 for s in shapes]
    grads = [rng.standard_normal(s).astype(np.float32) * 1e-3 for s in shapes]
    return params, grads


def minidist_step(params0: list[np.ndarray], grads: list[np.ndarray], fused_on: bool,
                  multi_tensor: bool = True, optimizer: str = "adamw"
                  ) -> tuple[Callable[[], None], Callable[[], list[np.ndarray]]]:
    ps = [Parameter(p.copy()) for p in params0]
    for p, g in zip(ps, grads):
        p.grad = g
    name, hyper, _ = OPTIMIZERS[optimizer]
    opt = getattr(optim, name)(ps, fused=fused_on, **hyper)

    def step() -> None:
        before, fused.MULTI_TENSOR = fused.MULTI_TENSOR, multi_tensor
        try:
            opt.step()
        finally:
            fused.MULTI_TENSOR = before

    return step, lambda: [p.array for p in ps]


def torch_step(torch: Any, params0: list[np.ndarray], grads: list[np.ndarray], kind: str,
               optimizer: str = "adamw"
               ) -> tuple[Callable[[], None], Callable[[], list[np.ndarray]]]:
    ps = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params0]
    for p, g in zip(ps, grads):
        p.grad = torch.from_numpy(g)
    name, hyper, _ = OPTIMIZERS[optimizer]
    opt = getattr(torch.optim, name)(ps, **{kind: True}, **hyper)
    return opt.step, lambda: [p.detach().numpy() for p in ps]


def train_step(repeats: int, out: str) -> int:
    """Phases of examples/train.py's default step (see the module docstring)."""
    from minidist import nn
    from minidist.tensor import Tensor

    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Dropout(0.1), nn.Linear(512, 256),
                          nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10))
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((16, 64)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, 16))
    loss_fn = nn.CrossEntropyLoss()

    def fwd_bwd() -> None:
        for p in model.parameters():
            p.grad = None
        loss_fn(model(x), y).backward()

    fwd_bwd()
    phases: dict[str, Callable[[], Any]] = {"forward": lambda: model(x), "forward+backward": fwd_bwd}
    for fused_on in (False, True):
        phases[f"AdamW{' fused' if fused_on else ''}"] = optim.AdamW(model.parameters(),
                                                                     fused=fused_on).step
    samples: dict[str, list[float]] = {name: [] for name in phases}
    for fn in phases.values():
        fn()
    for r in range(repeats):
        order = list(phases)
        random.Random(r).shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            phases[name]()
            samples[name].append(time.perf_counter() - t0)
    rows = [{"phase": name, **stats(s)} for name, s in samples.items()]
    print(f"# examples/train.py default step (MLP 64-512-256-10, batch 16, one thread), "
          f"median of {repeats}, us")
    table = Table([("phase", 18, "s"), ("median us", 10, ".1f"), ("min us", 8, ".1f")])
    print(table.header())
    for row in rows:
        print(table.row(row["phase"], row["median_us"], row["min_us"]))
    path = write_json(Path(out) / "train_step.json", {"benchmark": "train_step", "rows": rows,
                                                      "repeats": repeats,
                                                      "machine": machine_info()})
    print(f"# wrote {shown(path)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--numel", default="10496000", help="parameters in all (default 10.5M)")
    ap.add_argument("--layers", type=int, default=10, help="square layers (2 tensors each)")
    ap.add_argument("--repeats", type=int, default=15, help="timed rounds (median reported)")
    ap.add_argument("--check-steps", type=int, default=10, help="steps compared with torch")
    ap.add_argument("--out", default=str(LOCAL_RESULTS), help="folder for fused_optim.json")
    ap.add_argument("--no-torch", action="store_true", help="leave torch's columns out")
    ap.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw",
                    help="AdamW (default) or SGD with momentum")
    ap.add_argument("--train-step", action="store_true",
                    help="time examples/train.py's step by phase instead")
    a = ap.parse_args(argv)
    if a.train_step:
        return train_step(max(a.repeats, 3) * 20, a.out)

    torch = None
    if not a.no_torch:
        try:
            import torch  # type: ignore[no-redef]
            torch.set_num_threads(1)
        except ImportError:
            print("# torch is not importable here: its columns are left out")
    shapes = shapes_for(parse_bytes(a.numel), a.layers)
    numel = sum(int(np.prod(s)) for s in shapes)
    params0, grads = make_data(shapes)
    which = a.optimizer
    impls = {"default": lambda: minidist_step(params0, grads, False, optimizer=which),
             "fused": lambda: minidist_step(params0, grads, True, optimizer=which),
             "fused-per-tensor": lambda: minidist_step(params0, grads, True, False, which)}
    if torch is not None:
        for kind in ("foreach", "fused"):
            impls[f"torch-{kind}"] = (lambda k=kind: torch_step(torch, params0, grads, k, which))

    # 1. correctness: check_steps steps each, from the same start
    results: dict[str, list[np.ndarray]] = {}
    for name, make in impls.items():
        step, read = make()
        for _ in range(a.check_steps):
            step()
        results[name] = [r.copy() for r in read()]
    check = {f"{name}_bits_equal_default": all(np.array_equal(x, y) for x, y in
                                               zip(results[name], results["default"]))
             for name in ("fused", "fused-per-tensor")}
    ref_name = "torch-fused" if torch is not None else "default"
    for name, res in results.items():
        check[f"max_abs_diff_{name}_vs_{ref_name}"] = max(
            float(np.abs(x - y).max()) for x, y in zip(res, results[ref_name]))

    # 2. timing: one step per implementation per round, random order
    steppers = {name: make()[0] for name, make in impls.items()}
    for step in steppers.values():
        step()  # warm up (compiles the kernels, allocates the state)
    samples: dict[str, list[float]] = {name: [] for name in steppers}
    calls: dict[str, int] = {}
    for name, step in steppers.items():  # kernel calls per step (0: no compiled kernel)
        before = fused.kernel_calls()
        step()
        calls[name] = fused.kernel_calls() - before
    for r in range(a.repeats):
        order = list(steppers)
        random.Random(r).shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            steppers[name]()
            samples[name].append(time.perf_counter() - t0)

    rows = []
    med = {name: stats(s)["median_us"] / 1e3 for name, s in samples.items()}
    best_torch = min((v for k, v in med.items() if k.startswith("torch")), default=None)
    for name, s in samples.items():
        st = stats(s)
        rows.append({"impl": name, "median_ms": st["median_us"] / 1e3,
                     "min_ms": st["min_us"] / 1e3, "max_ms": st["max_us"] / 1e3,
                     "samples": st["samples"],
                     "GBps": OPTIMIZERS[which][2] * numel / (st["median_us"] * 1e3),
                     "kernel_calls": calls.get(name),
                     "vs_default": med[name] / med["default"],
                     "vs_best_torch": None if best_torch is None else med[name] / best_torch})
    print(f"# {OPTIMIZERS[which][0]} step, {numel:,} float32 parameters in {len(shapes)} tensors, one thread, "
          f"median of {a.repeats}; fused kernel: {fused.implementation(params0[0])}")
    table = Table([("impl", 16, "s"), ("median ms", 10, ".2f"), ("min ms", 8, ".2f"),
                   ("GB/s", 6, ".1f"), ("calls/step", 10, "d"), ("vs default", 10, ".2f"),
                   ("vs best torch", 13, ".2f")])
    print(table.header())
    for row in rows:
        print(table.row(row["impl"], row["median_ms"], row["min_ms"], row["GBps"],
                        row["kernel_calls"] if row["impl"].startswith("fused") else None,
                        row["vs_default"], row["vs_best_torch"]))
    for key, value in check.items():
        print(f"# {key}: {value}")
    data = {"benchmark": "fused_optim", "optimizer": OPTIMIZERS[which][0], "numel": numel,
            "tensors": len(shapes), "shapes": [list(s) for s in shapes],
            "hyper": OPTIMIZERS[which][1], "repeats": a.repeats,
            "threads": 1, "torch": None if torch is None else torch.__version__,
            "check_steps": a.check_steps, "check": check, "rows": rows,
            "machine": machine_info()}
    path = write_json(Path(a.out) / "fused_optim.json", data)
    print(f"# wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
