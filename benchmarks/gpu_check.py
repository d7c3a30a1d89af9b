"""One command that checks minidist on a GPU and measures its AMP kernels against torch and CuPy.

    python benchmarks/gpu_check.py --out runs/gpu_check          # under 4 minutes on one GPU
    source .gpu/env.sh && python3 benchmarks/gpu_check.py --out runs/gpu_check   # GPU image
    python benchmarks/gpu_check.py --cpu --out /tmp/gc            # smoke run on the CPU
    python benchmarks/gpu_check.py --markdown runs/gpu_check/gpu_check.json

Without a GPU (no CuPy, or ``cupy.cuda.is_available()`` False) it prints one line saying so and
exits with status 0. ``--cpu`` runs the same tables with NumPy arrays and the Numba CPU kernels
at small sizes (the table code, not a measurement of anything on a GPU).

Sections run one after the other, each in its own process with its own timeout, so a hang or a
crash (a CUDA error, a segfault) is recorded and the next section still runs. To add one, write
``def section_x(args) -> dict`` (return ``{"status": ..., "rows": [...], ...}``) and append a
``Section`` to ``SECTIONS``; ``markdown()`` prints any rows it finds.

    env          versions, the GPU, which kernel implementation runs (and why not, if not)
    gpu_tests    pytest -m gpu: every gpu-marked test
    kernels      fp32 unscale+check in place, fp16 -> fp32 master unscale, master -> fp16 model,
                 at 1K .. 256M elements: host us per call (persistent buffers; the launch
                 plan), GPU us by CUDA events (median), GB/s of the bytes the op must read +
                 write, share of a device copy's GB/s at that size; beside torch's kernels
                 (when importable), CuPy's two passes (the reference) and the dispatcher path
    train_step   one training step of a small and a GEMM-bound MLP, minidist vs torch eager,
                 fp32 and AMP (autocast + GradScaler)
    examples     examples/train.py --device cuda, and --amp
    mpi          mpiexec -n 2 examples/train.py --device cuda --amp
    gpu_training benchmarks/gpu_training.py under mpiexec -n 2 (two ranks on the GPU): the
                 device all-reduce staged / cuda_ipc / host with the staging bound, and the
                 step phases (fp32, fused optimizer, AMP) of three MLPs vs torch
    gpu_allreduce  gpu_training.py --sections ipc,ddp under mpiexec -n 2: cuda_ipc,
                 host_copy and auto at 4 B .. 64 MiB beside one device copy, the wide MLP's DDP
                 step (cuda_ipc / staged / one rank), each target pass/fail

Outputs: ``gpu_check.json`` (everything) and ``gpu_check.md`` (the tables, and the targets:
host <= 15 us per call, >= 90% of copy bandwidth from 16M, faster than torch at 64M, faster
than CuPy from 64K, every gpu-marked test passing) in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GPU_SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26, 1 << 28]  # 1K 64K 1M 16M 64M 256M
CPU_SIZES = [1 << 10, 1 << 16, 1 << 18]
CASE_BYTES = {"fp32_inplace": 8, "fp16_to_master": 6, "master_to_model": 6}
BUDGET_S = 230.0


@dataclass
class Section:
    name: str
    run: Callable[[argparse.Namespace], dict]
    timeout_s: float
    gpu_only: bool = False  # skipped under --cpu


def size_name(n: int) -> str:
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


# ----------------------------------------------------------------- device helpers

class Device:
    """NumPy (``--cpu``) or CuPy: arrays, sync, and a timer of one call (CUDA events)."""

    def __init__(self, cpu: bool) -> None:
        import numpy as np

        self.cpu = cpu
        if cpu:
            self.xp = np
        else:
            import cupy

            self.xp = cupy

    def sync(self) -> None:
        if not self.cpu:
            self.xp.cuda.get_current_stream().synchronize()

    def gpu_us(self, call: Callable[[], Any], reps: int) -> float:
        """Median device time of one call (CUDA events; wall time on the CPU)."""
        times = []
        for _ in range(reps):
            if self.cpu:
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e6)
                continue
            start, end = self.xp.cuda.Event(), self.xp.cuda.Event()
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(self.xp.cuda.get_elapsed_time(start, end) * 1e3)
        return statistics.median(times)


def host_us(call: Callable[[], Any], reps: int, sync: Callable[[], None]) -> float:
    """Median host time of one call (no sync in between: the launch cost)."""
    times = []
    for k in range(reps):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e6)
        if k % 50 == 49:
            sync()
    sync()
    return statistics.median(times)


class TorchGpuTimer:
    def __init__(self, torch: Any, cpu: bool) -> None:
        self.torch, self.cpu = torch, cpu

    def sync(self) -> None:
        if not self.cpu:
            self.torch.cuda.synchronize()

    def gpu_us(self, call: Callable[[], Any], reps: int) -> float:
        torch = self.torch
        times = []
        for _ in range(reps):
            if self.cpu:
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e6)
                continue
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)


def import_torch(cpu: bool) -> Any:
    try:
        import torch
    except ImportError:
        return None
    if not cpu and not torch.cuda.is_available():
        return None
    return torch


# ----------------------------------------------------------------- sections

def section_env(args: argparse.Namespace) -> dict:
    import numpy as np

    from minidist import kernels

    info: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__,
                            "platform": platform.platform()}
    for mod in ("numba", "numba_cuda", "numba_cuda_mlir", "cupy", "torch", "mpi4py"):
        try:
            info[mod] = getattr(__import__(mod), "__version__", "installed")
        except Exception as exc:  # not installed, or broken: say which
            info[mod] = f"not importable ({type(exc).__name__})"
    dev = Device(args.cpu)
    probe = dev.xp.zeros(4, dev.xp.float32)
    info["implementation"] = kernels.implementation(probe)
    info["fallback_reason"] = kernels.fallback_reason(probe)
    if not args.cpu:
        props = dev.xp.cuda.runtime.getDeviceProperties(0)
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        info["sm_count"] = props["multiProcessorCount"]
        info["cuda_runtime"] = dev.xp.cuda.runtime.runtimeGetVersion()
        info["driver"] = dev.xp.cuda.runtime.driverGetVersion()
    info["status"] = "ok"
    return info


def section_gpu_tests(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
           "tests/cuda", "tests/amp/test_amp.py"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout - 5)
    tail = res.stdout[-3000:] + res.stderr[-1000:]
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", tail)}
    ok = res.returncode == 0 and counts.get("passed", 0) > 0 and not counts.get("failed")
    return {"status": "ok" if ok else "failed", "command": " ".join(cmd[1:]), "counts": counts,
            "returncode": res.returncode, "tail": tail[-1500:]}


def _kernel_impls(dev: Device, torch: Any, n: int) -> list[tuple[str, str, Callable, Any, Any]]:
    """(case, impl, call, timer, check) for one size; buffers persist across calls."""
    import numpy as np

    from minidist import kernels
    from minidist.kernels import reference

    xp = dev.xp
    if dev.cpu:
        normal = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    else:
        normal = xp.random.RandomState(0).standard_normal(n, dtype=xp.float32)
    g32 = (normal * 1024).astype(xp.float32)
    g16, m32 = g32.astype(xp.float16), xp.empty(n, xp.float32)
    master, h16 = g32 / xp.float32(1024), xp.empty(n, xp.float16)
    found = xp.zeros(1, xp.float32)
    src_copy, dst_copy = xp.empty(n, xp.float32), xp.empty(n, xp.float32)
    flip = {"fused": [0], "cupy": [0], "torch": [0], "dispatcher": [0]}
    inv16 = 2.0 ** -10

    def alternating(key: str) -> float:  # in place: x 1/2, x 2, ... (exact, data stays)
        flip[key][0] += 1
        return 0.5 if flip[key][0] % 2 else 2.0

    def copy() -> None:
        if dev.cpu:
            np.copyto(dst_copy, src_copy)
        else:
            dst_copy.data.copy_from_device_async(src_copy.data, src_copy.nbytes)

    def dispatcher(fn: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> None:
            from minidist.kernels import cuda as kcuda
            saved = kcuda.FAST_LAUNCH
            kcuda.FAST_LAUNCH = False
            try:
                fn()
            finally:
                kcuda.FAST_LAUNCH = saved
        return call

    want16 = (g16.astype(xp.float32) * xp.float32(inv16))
    with np.errstate(over="ignore"):
        want_h = master.astype(xp.float16)
    checks = {"fp32_inplace": None,
              "fp16_to_master": lambda: bool(
                  (m32.view(xp.uint32) == want16.view(xp.uint32)).all()),
              "master_to_model": lambda: bool(
                  (h16.view(xp.uint16) == want_h.view(xp.uint16)).all())}
    impls = [
        ("copy", "device copy", copy, dev, None),
        ("fp32_inplace", "fused", lambda: kernels.unscale_and_check_(
            g32, g32, alternating("fused"), found), dev, checks["fp32_inplace"]),
        ("fp32_inplace", "cupy" if not dev.cpu else "numpy", lambda: reference.unscale_and_check_(
            g32, g32, alternating("cupy"), found), dev, None),
        ("fp16_to_master", "fused", lambda: kernels.unscale_and_check_(g16, m32, inv16, found),
         dev, checks["fp16_to_master"]),
        ("fp16_to_master", "cupy" if not dev.cpu else "numpy",
         lambda: reference.unscale_and_check_(g16, m32, inv16, found), dev,
         checks["fp16_to_master"]),
        ("master_to_model", "fused", lambda: kernels.master_to_model(master, h16), dev,
         checks["master_to_model"]),
        ("master_to_model", "cupy" if not dev.cpu else "numpy",
         lambda: reference.master_to_model(master, h16), dev, checks["master_to_model"]),
    ]
    if not dev.cpu:
        impls += [
            ("fp32_inplace", "fused (dispatcher)", dispatcher(lambda: kernels.unscale_and_check_(
                g32, g32, alternating("dispatcher"), found)), dev, None),
            ("fp16_to_master", "fused (dispatcher)", dispatcher(
                lambda: kernels.unscale_and_check_(g16, m32, inv16, found)), dev, None),
            ("master_to_model", "fused (dispatcher)", dispatcher(
                lambda: kernels.master_to_model(master, h16)), dev, None),
        ]
    if torch is not None:
        where = "cpu" if dev.cpu else "cuda"
        t32 = torch.randn(n, device=where) * 1024
        t16, tm32 = t32.half(), torch.empty(n, device=where)
        tmaster, th16 = t32 / 1024, torch.empty(n, dtype=torch.float16, device=where)
        tfound = torch.zeros(1, device=where)
        tinv = {v: torch.tensor([v], device=where) for v in (0.5, 2.0, inv16)}
        timer = TorchGpuTimer(torch, dev.cpu)

        def torch16() -> None:
            tm32.copy_(t16)
            torch._amp_foreach_non_finite_check_and_unscale_([tm32], tfound, tinv[inv16])

        impls += [
            ("fp32_inplace", "torch", lambda: torch._amp_foreach_non_finite_check_and_unscale_(
                [t32], tfound, tinv[alternating("torch")]), timer, None),
            ("fp16_to_master", "torch", torch16, timer, None),
            ("master_to_model", "torch", lambda: th16.copy_(tmaster), timer, None),
        ]
    return impls


def section_kernels(args: argparse.Namespace) -> dict:
    dev = Device(args.cpu)
    torch = None if args.no_torch else import_torch(args.cpu)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        CPU_SIZES if args.cpu else GPU_SIZES)
    rows: list[dict] = []
    deadline = time.perf_counter() + args.timeout - 10
    for n in sizes:
        if time.perf_counter() > deadline:
            rows.append({"n": n, "status": "skipped: out of time"})
            continue
        impls = _kernel_impls(dev, torch, n)
        copy_us = None
        for case, impl, call, timer, check in impls:
            for _ in range(3):  # compile, build the plan, warm up
                call()
            timer.sync()
            exact = check() if check is not None else None
            reps_host = 200 if n <= 1 << 20 else 40
            reps_gpu = 30 if n <= 1 << 24 else 15
            h = host_us(call, reps_host, timer.sync)
            g = timer.gpu_us(call, reps_gpu)
            nbytes = (8 if case == "copy" else CASE_BYTES[case]) * n
            row = {"case": case, "impl": impl, "n": n, "host_us": h, "gpu_us": g,
                   "GBps": nbytes / (g * 1e3), "exact": exact}
            if case == "copy":
                copy_us = g
            elif copy_us is not None:
                row["copy_share"] = row["GBps"] / (8 * n / (copy_us * 1e3))
            rows.append(row)
        del impls
        if not args.cpu:
            dev.xp.get_default_memory_pool().free_all_blocks()
            if torch is not None:
                torch.cuda.empty_cache()
    return {"status": "ok", "rows": rows, "torch": getattr(torch, "__version__", None)}


def _mlp(nn: Any, widths: list[int]) -> Any:
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def section_train_step(args: argparse.Namespace) -> dict:
    import numpy as np

    import minidist
    from minidist import xp as backend

    torch = None if args.no_torch else import_torch(args.cpu)
    device = "cpu" if args.cpu else "cuda"
    backend.set_default_device(device)
    dev = Device(args.cpu)
    models = ({"small": ([64, 128, 10], 32), "gemm": ([128, 256, 256, 10], 64)} if args.cpu
              else {"small": ([64, 256, 10], 64), "gemm": ([4096, 4096, 4096, 10], 4096)})
    rows = []
    for name, (widths, batch) in models.items():
        rng = np.random.default_rng(0)
        xh = rng.standard_normal((batch, widths[0])).astype(np.float32)
        yh = rng.integers(0, widths[-1], batch)
        for mode in ("fp32", "amp"):
            minidist.manual_seed(0)
            step = _minidist_step(widths, xh, yh, device, mode == "amp")
            ours = _time_steps(step, dev.sync)
            theirs = None
            if torch is not None:
                theirs = _torch_step_ms(torch, widths, xh, yh, device, mode)
            rows.append({"model": name, "widths": widths, "batch": batch, "mode": mode,
                         "minidist_ms": ours, "torch_ms": theirs,
                         "ratio": ours / theirs if theirs else None,
                         **step_counts(step, widths, device)})
    return {"status": "ok", "rows": rows}


def step_counts(step: Callable[[], None], widths: list[int], device: str) -> dict:
    """What one step does besides computing, counted (device-independent, so the CPU smoke
    run checks them too): device-to-host transfers (``xp.count_host_transfers``), Python
    function calls (``sys.setprofile``), autocast's casts (weights and others), and the
    kernel calls of one ``SGD(fused=True)`` step over the same (unflattened) model."""
    import numpy as np

    from minidist import nn, optim
    from minidist import xp as backend
    from minidist.optim import fused
    from minidist.tensor import autocast_mode

    casts0 = autocast_mode.cast_counts()
    calls = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1

    with backend.count_host_transfers() as transfers:
        sys.setprofile(profile)
        try:
            step()
        finally:
            sys.setprofile(None)
    casts1 = autocast_mode.cast_counts()
    model = _mlp(nn, widths)
    params = list(model.parameters())
    opt = optim.SGD(params, lr=1e-3, momentum=0.9, fused=True)
    for p in params:
        p.grad = backend.to_device(np.zeros(p.shape, np.float32), device)
    opt.step()  # compiles, allocates the momentum buffers
    launches0 = fused.kernel_calls()
    opt.step()
    return {"host_syncs": sum(transfers.values()), "host_sync_ops": dict(transfers),
            "python_calls": calls[0],
            "weight_casts": casts1.get("weights", 0) - casts0.get("weights", 0),
            "other_casts": casts1.get("others", 0) - casts0.get("others", 0),
            "params": len(params), "opt_launches": fused.kernel_calls() - launches0}


def _minidist_step(widths: list[int], xh: Any, yh: Any, device: str,
                   use_amp: bool) -> Callable[[], None]:
    import minidist
    from minidist import amp, nn, optim
    from minidist import xp as backend

    model = _mlp(nn, widths)
    opt = optim.SGD(model.parameters(), lr=1e-3)
    scaler = amp.GradScaler(device, enabled=use_amp)
    x, y = minidist.Tensor(backend.to_device(xh)), backend.to_device(yh)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        with amp.autocast(device, enabled=use_amp):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    return step


def _time_steps(step: Callable[[], None], sync: Callable[[], None], warmup: int = 3,
                reps: int = 10) -> float:
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _torch_step_ms(torch: Any, widths: list[int], xh: Any, yh: Any, device: str,
                   mode: str) -> float:
    torch.manual_seed(0)
    layers: list[Any] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device, enabled=mode == "amp")
    x, y = torch.from_numpy(xh).to(device), torch.from_numpy(yh).to(device)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp_dtype = torch.float16 if device == "cuda" else torch.bfloat16

    def step() -> None:
        with torch.autocast(device, dtype=amp_dtype, enabled=mode == "amp"):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return _time_steps(step, torch.cuda.synchronize if device == "cuda" else (lambda: None))


def _run_train(cmd: list[str], timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}"
                                  f"{os.environ.get('PYTHONPATH', '')}"})
    except subprocess.TimeoutExpired:
        return {"command": " ".join(cmd), "status": f"timeout after {timeout:.0f} s"}
    acc = re.findall(r"final test_acc ([0-9.]+)", res.stdout)
    warnings = [line for line in (res.stdout + res.stderr).splitlines() if "Warning" in line]
    return {"command": " ".join(Path(c).name if c == sys.executable else c for c in cmd),
            "status": "ok" if res.returncode == 0 and acc else f"exit {res.returncode}",
            "test_acc": float(acc[-1]) if acc else None,
            "elapsed_s": round(time.perf_counter() - t0, 1), "warnings": warnings[:5],
            "tail": (res.stdout[-800:] + res.stderr[-1200:]) if res.returncode else ""}


def section_examples(args: argparse.Namespace) -> dict:
    train = str(REPO / "examples" / "train.py")
    rows = [_run_train([sys.executable, train, "--device", "cuda", *extra, "--epochs", "5"],
                       (args.timeout - 5) / 2) for extra in ([], ["--amp"])]
    return {"status": "ok" if all(r["status"] == "ok" for r in rows) else "failed",
            "rows": rows}


def mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def section_mpi(args: argparse.Namespace) -> dict:
    launcher = mpiexec()
    if launcher is None:
        return {"status": "skipped: no mpiexec (pip install mpich mpi4py, or source "
                          ".gpu/env.sh on the GPU image)"}
    row = _run_train([launcher, "-n", "2", sys.executable, str(REPO / "examples" / "train.py"),
                      "--device", "cuda", "--amp", "--epochs", "5"], args.timeout - 5)
    return {"status": row["status"], "rows": [row]}


def section_gpu_training(args: argparse.Namespace) -> dict:
    """benchmarks/gpu_training.py (its own JSON), short: 5 repeats, 1/16/64 MiB."""
    script = str(REPO / "benchmarks" / "gpu_training.py")
    out = Path(args.out) / "gpu_training"
    cmd = [sys.executable, script, "--repeats", "5", "--out", str(out)]
    if args.cpu:
        cmd += ["--cpu-dry-run", "--models", "small", "--repeats", "1"]
    else:
        launcher = mpiexec()
        if launcher is not None:  # (ipc, ddp: the gpu_allreduce section)
            cmd = [launcher, "-n", "2", *cmd, "--sizes", "1M,16M,64M", "--sections",
                   "allreduce,step"]
        else:
            cmd += ["--sections", "step"]
    cmd += ["--no-torch"] if args.no_torch else []
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                         timeout=max(args.timeout - 5, 5))
    path = out / "gpu_training.json"
    if res.returncode != 0 or not path.exists():
        return {"status": f"exit {res.returncode}", "tail": res.stdout[-1500:] + res.stderr[-1500:]}
    data = json.loads(path.read_text())
    sections = data.get("sections", {})
    failed = [k for k, v in sections.items() if "error" in v]
    return {"status": "ok" if not failed else f"failed: {', '.join(failed)}",
            "command": " ".join(Path(c).name if c in (sys.executable, script) else c
                                for c in cmd),
            "allreduce_rows": sections.get("allreduce", {}).get("rows", []),
            "step_rows": sections.get("step", {}).get("rows", []),
            "errors": {k: sections[k]["error"] for k in failed}}


def section_gpu_allreduce(args: argparse.Namespace) -> dict:
    """gpu_training.py --sections ipc,ddp under mpiexec -n 2: the device all-reduce at the
    copy bound (4 B .. 64 MiB) and the wide MLP's DDP step, with their targets; ``--cpu``:
    benchmarks/gpu_allreduce.py --cpu (the protocol on host windows; no target judged)."""
    launcher = mpiexec()
    if launcher is None:
        return {"status": "skipped: no mpiexec (pip install mpich mpi4py, or source "
                          ".gpu/env.sh on the GPU image)"}
    out = Path(args.out) / "gpu_allreduce"
    if args.cpu:
        script, name = str(REPO / "benchmarks" / "gpu_allreduce.py"), "gpu_allreduce.json"
        cmd = [launcher, "-n", "2", sys.executable, script, "--cpu", "--repeats", "3"]
    else:
        script, name = str(REPO / "benchmarks" / "gpu_training.py"), "gpu_training.json"
        cmd = [launcher, "-n", "2", sys.executable, script, "--sections", "ipc,ddp",
               "--repeats", "10"]
    cmd += ["--out", str(out)]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                         timeout=max(args.timeout - 5, 5))
    path = out / name
    if res.returncode != 0 or not path.exists():
        return {"status": f"exit {res.returncode}", "tail": res.stdout[-1500:] + res.stderr[-1500:]}
    data = json.loads(path.read_text())
    part = data if args.cpu else data.get("sections", {}).get("ipc", {})
    if "error" in part:
        return {"status": f"failed: {part['error']}"}
    return {"status": "ok", "command": " ".join(Path(c).name if c in (sys.executable, script)
                                                else c for c in cmd),
            "rows": part.get("rows", []), "ddp_rows": part.get("ddp_rows", []),
            "targets": part.get("targets", [])}


def allreduce_markdown(result: dict) -> list[str]:
    """The gpu_allreduce section's tables (markdown lines)."""
    part = result.get("gpu_allreduce", {})
    lines: list[str] = []
    if part.get("rows"):
        lines += ["| bytes | cuda_ipc us | host_copy us | auto us (algorithm) | host us | "
                  "d2h + h2d us | device copy us | cuda_ipc / copy | auto / bound |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in part["rows"]:
            lines.append(f"| {r['bytes']} | {r['cuda_ipc_us']:.1f} | "
                         f"{_fmt(r.get('host_copy_us'))} | {r['auto_us']:.1f} "
                         f"({r['auto_algorithm']}) | {r['host_us']:.1f} | "
                         f"{r['d2h_us'] + r['h2d_us']:.1f} | {r['copy_us']:.1f} | "
                         f"{r['cuda_ipc_vs_copy']:.2f} | {r['auto_vs_bound']:.2f} |")
        lines.append("")
    for r in part.get("ddp_rows", []):
        lines += [f"DDP step, {r['model']} MLP, {r['ranks']} ranks: cuda_ipc "
                  f"{r['cuda_ipc_ms']:.2f} ms, staged {r['staged_ms']:.2f} ms, one rank "
                  f"{_fmt(r.get('one_rank_ms'), '.2f')} ms", ""]
    return lines


def allreduce_targets(result: dict) -> list[dict]:
    """The device all-reduce's done-when checks, as gpu_allreduce judged them."""
    return list(result.get("gpu_allreduce", {}).get("targets", []))


SECTIONS = [
    Section("env", section_env, 30),
    Section("gpu_tests", section_gpu_tests, 75, gpu_only=True),
    Section("kernels", section_kernels, 60),
    Section("train_step", section_train_step, 40),
    Section("examples", section_examples, 40, gpu_only=True),
    Section("mpi", section_mpi, 35, gpu_only=True),
    Section("gpu_training", section_gpu_training, 60),
    Section("gpu_allreduce", section_gpu_allreduce, 120),
]


# ----------------------------------------------------------------- targets and tables

def targets(result: dict) -> list[dict]:
    """The done-when checks, from the measured rows (None where not measured)."""
    kern = [r for r in result.get("kernels", {}).get("rows", []) if "case" in r]
    fused = [r for r in kern if r["impl"] == "fused"]

    def best(impl: str, case: str, n: int) -> float | None:
        return next((r["gpu_us"] for r in kern if r["impl"] == impl and r["case"] == case
                     and r["n"] == n), None)

    out = []

    def add(name: str, ok: bool | None, detail: str) -> None:
        out.append({"target": name, "pass": ok, "detail": detail})

    if fused:
        worst = max(fused, key=lambda r: r["host_us"])
        add("host time <= 15 us per call (persistent buffers)", worst["host_us"] <= 15.0,
            f"max {worst['host_us']:.1f} us ({worst['case']}, n={size_name(worst['n'])})")
        big = [r for r in fused if r["n"] >= 1 << 24 and "copy_share" in r]
        if big:
            low = min(big, key=lambda r: r["copy_share"])
            add(">= 90% of a device copy's bandwidth from 16M", low["copy_share"] >= 0.9,
                f"min {100 * low['copy_share']:.0f}% ({low['case']}, n={size_name(low['n'])})")
        at64 = [(c, best("fused", c, 1 << 26), best("torch", c, 1 << 26)) for c in CASE_BYTES]
        at64 = [(c, f, t) for c, f, t in at64 if f is not None and t is not None]
        if at64:
            add("faster than torch at 64M", all(f < t for _, f, t in at64),
                "; ".join(f"{c} {f:.0f} vs {t:.0f} us" for c, f, t in at64))
        vs = [(c, n, best("fused", c, n), best("cupy", c, n)) for c in CASE_BYTES
              for n in sorted({r["n"] for r in fused}) if n >= 1 << 16]
        vs = [v for v in vs if v[2] is not None and v[3] is not None]
        if vs:
            slow = [f"{c} {size_name(n)}" for c, n, f, cp in vs if f >= cp]
            add("faster than CuPy's two passes from 64K", not slow,
                "slower at: " + ", ".join(slow) if slow else f"all {len(vs)} (case, size)")
    training = result.get("gpu_training", {})
    for r in training.get("allreduce_rows", []):
        mib = r["bytes"] >> 20
        add(f"staged device all-reduce within 1.3 x host + d2h + h2d ({mib} MiB)",
            r["staged_vs_bound"] <= 1.0, f"{r['staged_vs_bound']:.2f} of the bound")
        if r.get("cuda_ipc_vs_staged") is not None:
            add(f"cuda_ipc <= 0.5 x staged ({mib} MiB)", r["cuda_ipc_vs_staged"] <= 0.5,
                f"{r['cuda_ipc_vs_staged']:.2f}")
    steps = result.get("train_step", {}).get("rows", [])
    counted = [r for r in steps if "host_syncs" in r]
    if counted:
        worst = {m: max((r["host_syncs"] for r in counted if r["mode"] == m), default=0)
                 for m in ("fp32", "amp")}
        add("no host sync in an fp32 step, one (the scaler's) in an AMP step",
            worst["fp32"] == 0 and worst["amp"] <= 1,
            f"max {worst['fp32']} (fp32), {worst['amp']} (AMP) per step")
        amp_rows = [r for r in counted if r["mode"] == "amp"]
        if amp_rows:
            add("an AMP step casts each weight at most once",
                all(r["weight_casts"] <= r["params"] for r in amp_rows),
                ", ".join(f"{r['model']} {r['weight_casts']} for {r['params']}"
                          for r in amp_rows))
        add("a fused optimizer step is one launch per (device, dtype)",
            all(r["opt_launches"] <= 1 for r in counted),
            f"max {max(r['opt_launches'] for r in counted)} per step")
    runs = [r for s in ("examples", "mpi") for r in result.get(s, {}).get("rows", [])]
    if runs:
        warned = [r["command"] for r in runs
                  if any("NumbaPerformanceWarning" in w for w in r.get("warnings", []))]
        add("no NumbaPerformanceWarning in training runs", not warned,
            "warned: " + "; ".join(warned) if warned else f"none in {len(runs)} runs")
    limits = {"wide": (1.15, 1.3), "deep": (1.15, 1.3), "small": (1.5, 1.5)}
    for r in training.get("step_rows", []):
        if r.get("step_vs_torch") is None:
            continue
        if r["model"] in limits:
            fp32, amp = limits[r["model"]]
            add(f"{r['model']} MLP fp32 step <= {fp32} x torch", r["step_vs_torch"] <= fp32,
                f"{r['step_vs_torch']:.2f}")
            add(f"{r['model']} MLP AMP step <= {amp} x torch", r["amp_step_vs_torch"] <= amp,
                f"{r['amp_step_vs_torch']:.2f}")
        add(f"{r['model']} MLP optimizer step <= 1.2 x torch", r["opt_vs_torch"] <= 1.2,
            f"{r['opt_vs_torch']:.2f}")
    out += allreduce_targets(result)
    tests = result.get("gpu_tests", {})
    if "counts" in tests:
        add("every gpu-marked test passes", tests["status"] == "ok", str(tests["counts"]))
    return out


def _fmt(v: Any, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def markdown(result: dict) -> str:
    lines = [f"# GPU check ({result.get('mode', 'gpu')})", ""]
    env = result.get("env", {})
    if env:
        keys = ("gpu", "sm_count", "python", "numpy", "numba", "numba_cuda", "cupy", "torch",
                "implementation", "fallback_reason")
        lines += ["| " + " | ".join(k for k in keys if k in env) + " |",
                  "|" + "---|" * sum(k in env for k in keys),
                  "| " + " | ".join(_fmt(env[k]) for k in keys if k in env) + " |", ""]
    tg = result.get("targets", [])
    if tg:
        lines += ["| target | met | measured |", "|---|---|---|"]
        lines += [f"| {t['target']} | {_fmt(t['pass'])} | {t['detail']} |" for t in tg]
        lines.append("")
    rows = [r for r in result.get("kernels", {}).get("rows", []) if "case" in r]
    if rows:
        lines += ["| case | n | impl | host us/call | GPU us | GB/s | % of copy | exact |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            share = f"{100 * r['copy_share']:.0f}%" if "copy_share" in r else "-"
            lines.append(f"| {r['case']} | {size_name(r['n'])} | {r['impl']} | "
                         f"{r['host_us']:.1f} | {r['gpu_us']:.1f} | {r['GBps']:.1f} | {share} | "
                         f"{_fmt(r.get('exact'))} |")
        lines.append("")
    steps = result.get("train_step", {}).get("rows", [])
    if steps:
        lines += ["| model | batch | mode | minidist ms/step | torch ms/step | minidist / torch | "
                  "host syncs | Python calls | weight casts | fused opt launches |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in steps:
            lines.append(f"| {r['model']} {'-'.join(map(str, r['widths']))} | {r['batch']} | "
                         f"{r['mode']} | {r['minidist_ms']:.2f} | {_fmt(r['torch_ms'], '.2f')} | "
                         f"{_fmt(r['ratio'], '.2f')} | {_fmt(r.get('host_syncs'))} | "
                         f"{_fmt(r.get('python_calls'))} | {_fmt(r.get('weight_casts'))} | "
                         f"{_fmt(r.get('opt_launches'))} |")
        lines.append("")
    training = result.get("gpu_training", {})
    if training.get("allreduce_rows"):
        lines += ["| MiB | staged ms | host ms | cuda_ipc ms | device copy ms | d2h + h2d ms | "
                  "staged / bound | cuda_ipc / staged |", "|---|---|---|---|---|---|---|---|"]
        for r in training["allreduce_rows"]:
            staged = min(r["staged_shm_ms"], r["staged_ring_ms"])
            host = min(r["host_shm_ms"], r["host_ring_ms"])
            lines.append(f"| {r['bytes'] >> 20} | {staged:.2f} | {host:.2f} | "
                         f"{_fmt(r['cuda_ipc_ms'], '.2f')} | {r['device_copy_ms']:.3f} | "
                         f"{r['d2h_ms'] + r['h2d_ms']:.2f} | {r['staged_vs_bound']:.2f} | "
                         f"{_fmt(r['cuda_ipc_vs_staged'], '.2f')} |")
        lines.append("")
    if training.get("step_rows"):
        lines += ["| model | fwd+bwd ms (torch) | optimizer ms default / fused (torch) | "
                  "AMP step ms (torch) | step / torch | AMP / torch |",
                  "|---|---|---|---|---|---|"]
        for r in training["step_rows"]:
            topt = (None if "torch_opt_fused_ms" not in r
                    else min(r["torch_opt_foreach_ms"], r["torch_opt_fused_ms"]))
            lines.append(f"| {r['model']} {'-'.join(map(str, r['widths']))} | "
                         f"{r['minidist_fwd_bwd_ms']:.2f} ({_fmt(r.get('torch_fwd_bwd_ms'), '.2f')})"
                         f" | {r['minidist_opt_ms']:.2f} / {r['minidist_opt_fused_ms']:.2f} "
                         f"({_fmt(topt, '.2f')}) | {r['minidist_amp_step_ms']:.2f} "
                         f"({_fmt(r.get('torch_amp_step_ms'), '.2f')}) | "
                         f"{_fmt(r.get('step_vs_torch'), '.2f')} | "
                         f"{_fmt(r.get('amp_step_vs_torch'), '.2f')} |")
        lines.append("")
    lines += allreduce_markdown(result)
    runs = [r for s in ("examples", "mpi") for r in result.get(s, {}).get("rows", [])]
    if runs:
        lines += ["| command | status | test_acc | elapsed s |", "|---|---|---|---|"]
        lines += [f"| `{r['command']}` | {r['status']} | {_fmt(r.get('test_acc'), '.4f')} | "
                  f"{_fmt(r.get('elapsed_s'))} |" for r in runs]
        lines.append("")
    lines += ["| section | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {s.get('status', '-')} | {_fmt(s.get('seconds'))} |"
              for name, s in result.items() if isinstance(s, dict) and "status" in s]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- driver

def gpu_missing() -> str | None:
    """Why there is no GPU to check (one line), or None when there is one."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        if not cupy.cuda.is_available():
            return "cupy.cuda.is_available() is False (no GPU or driver)"
    except Exception as exc:  # a broken driver raises instead of answering
        return f"CuPy cannot reach a GPU ({type(exc).__name__}: {exc})"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(REPO / "runs" / "gpu_check"))
    p.add_argument("--cpu", action="store_true", help="smoke run on the CPU (NumPy, small)")
    p.add_argument("--sections", default="", help="comma-separated subset (default: all)")
    p.add_argument("--sizes", default="", help="kernel sizes in elements, comma-separated")
    p.add_argument("--no-torch", action="store_true", help="no torch rows")
    p.add_argument("--markdown", metavar="JSON", help="print the tables of a result and exit")
    p.add_argument("--section", help=argparse.SUPPRESS)    # internal: run one, write --part
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run_one(args: argparse.Namespace) -> int:
    section = next(s for s in SECTIONS if s.name == args.section)
    try:
        result = section.run(args)
    except Exception as exc:  # recorded, not fatal: the parent goes on
        import traceback
        result = {"status": f"error: {type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc()[-3000:]}
    Path(args.part).write_text(json.dumps(result, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    if args.section:
        return run_one(args)
    if not args.cpu:
        why = gpu_missing()
        if why is not None:
            print(f"gpu_check: no GPU to check here ({why}); nothing measured. "
                  "`--cpu` runs a smoke test of the tables on the CPU.")
            return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = [s for s in args.sections.split(",") if s]
    result: dict[str, Any] = {"mode": "cpu smoke" if args.cpu else "gpu",
                              "argv": sys.argv[1:] if argv is None else argv}
    t_start = time.perf_counter()
    for section in SECTIONS:
        if wanted and section.name not in wanted:
            continue
        if args.cpu and section.gpu_only:
            result[section.name] = {"status": "skipped: --cpu"}
            continue
        left = BUDGET_S - (time.perf_counter() - t_start)
        if left < 10:
            result[section.name] = {"status": "skipped: the 4-minute budget is spent"}
            continue
        timeout = min(section.timeout_s, left)
        part = out / f".{section.name}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--section", section.name,
               "--part", str(part), "--timeout", str(timeout), "--out", str(out)]
        cmd += ["--cpu"] if args.cpu else []
        cmd += ["--no-torch"] if args.no_torch else []
        cmd += ["--sizes", args.sizes] if args.sizes else []
        t0 = time.perf_counter()
        print(f"# {section.name} (timeout {timeout:.0f} s) ...", flush=True)
        try:
            res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                 timeout=timeout + 5)
            if part.exists():
                entry = json.loads(part.read_text())
                part.unlink()
            else:
                entry = {"status": f"crashed (exit {res.returncode})",
                         "tail": (res.stdout[-1000:] + res.stderr[-2000:])}
        except subprocess.TimeoutExpired:
            entry = {"status": f"timeout after {timeout:.0f} s"}
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        result[section.name] = entry
        print(f"#   {entry['status']} ({entry['seconds']} s)", flush=True)
    result["targets"] = targets(result)
    result["total_s"] = round(time.perf_counter() - t_start, 1)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    table = markdown(result)
    (out / "gpu_check.md").write_text(table)
    print(table)
    print(f"# wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'} "
          f"({result['total_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
