"""GPU training rows: device all-reduce (staged / cuda_ipc / host) and step phases vs torch.

    mpiexec -n 2 python benchmarks/gpu_training.py             # all-reduce rows + step rows
    python benchmarks/gpu_training.py --sections step           # one process: step rows only
    python benchmarks/gpu_training.py --sizes 1M,16M --repeats 5 --out /tmp/g

Without CuPy or a GPU it prints one line and exits 0 (nothing to measure).

Sections (``--sections``, comma-separated; default all that the launch allows):

  allreduce  (needs >= 2 ranks, e.g. two sharing one GPU) per size: the all-reduce of a
             float32 device buffer staged through host memory (``algorithm="shm"`` and
             ``"ring"``: minidist.fastpath.staging), over CUDA IPC (``"cuda_ipc"``), and of a host
             buffer of the same bytes with the same algorithm; one device-to-device copy of
             the bytes; pinned device->host and host->device copies; and the staging target
             ``1.3 x host + d2h + h2d`` with the staged time's ratio to it. Medians on rank 0,
             each repeat started after a barrier.
  ipc        (needs >= 2 ranks) the device all-reduce at the copy bound, 4 B to 64 MiB:
             cuda_ipc, host_copy and auto beside one device copy and host + d2h + h2d, with a
             pass/fail per target (benchmarks/gpu_allreduce.py, where they are described)
  ddp        (needs >= 2 ranks) the wide MLP's DDP step on the ranks: cuda_ipc, staged, and
             one rank alone (gpu_allreduce.py)
  step       (rank 0) one training step of three MLPs (SGD momentum 0.9) on the GPU, phase
             by phase, minidist beside torch (when torch sees the GPU): forward, forward +
             backward, optimizer step (default and ``fused=True``) in fp32, and a whole AMP
             step (autocast float16 forward + loss, GradScaler); medians, ms. Models:
             small 64-128-10 (batch 64), wide 1024-4096-4096-1000 (512), deep 8 x 512 (256).

``--cpu-dry-run`` runs the step section on the CPU (NumPy, torch CPU): it checks this script
where there is no GPU (the tests do); its numbers are not the GPU rows.

Output: a table per section on stdout, and ``gpu_training.json`` in ``--out`` (default
runs/bench/) with the machine, the arguments and every row (a section that fails records its
error instead of its rows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import LOCAL_RESULTS, Table, machine_info, parse_bytes, shown, write_json  # noqa: E402

from minidist import xp as backend  # noqa: E402

MLPS = {  # name: (layer widths, batch)
    "small": ([64, 128, 10], 64),
    "wide": ([1024, 4096, 4096, 1000], 512),
    "deep": ([512] * 9, 256),  # eight 512-wide layers
}


def under_mpi() -> bool:
    return any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))


def median_ms(fn: Callable[[], None], sync: Callable[[], None], repeats: int,
              before: Callable[[], None] | None = None) -> float:
    fn()
    sync()  # warm-up: compiles, allocates
    samples = []
    for _ in range(repeats):
        if before is not None:
            before()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


# ----------------------------------------------------------------------------- all-reduce

def allreduce_rows(cp: Any, sizes: list[int], repeats: int) -> list[dict]:
    from minidist import comm

    group = comm.get_default_group()
    sync = cp.cuda.Device().synchronize
    rows = []
    for nbytes in sizes:
        numel = nbytes // 4
        dev = cp.ones(numel, cp.float32)
        host = np.ones(numel, np.float32)
        other = cp.empty_like(dev)
        import cupyx

        pin = cupyx.empty_pinned((numel,), np.float32)
        barrier = comm.barrier
        row: dict[str, Any] = {"bytes": nbytes, "ranks": comm.get_world_size()}
        for algo in ("shm", "ring"):
            row[f"staged_{algo}_ms"] = median_ms(
                lambda a=algo: group.all_reduce(dev, op="avg", algorithm=a), sync, repeats,
                barrier)
            row[f"host_{algo}_ms"] = median_ms(
                lambda a=algo: group.all_reduce(host, op="avg", algorithm=a), sync, repeats,
                barrier)
        try:
            row["cuda_ipc_ms"] = median_ms(
                lambda: group.all_reduce(dev, op="avg", algorithm="cuda_ipc"), sync, repeats,
                barrier)
        except ValueError as exc:  # e.g. ranks on several nodes
            row["cuda_ipc_ms"], row["cuda_ipc_error"] = None, str(exc)
        row["device_copy_ms"] = median_ms(lambda: other.__setitem__(Ellipsis, dev), sync,
                                          repeats)
        row["d2h_ms"] = median_ms(lambda: dev.get(out=pin), sync, repeats)
        row["h2d_ms"] = median_ms(lambda: dev.set(pin), sync, repeats)
        best_host = min(row["host_shm_ms"], row["host_ring_ms"])
        best_staged = min(row["staged_shm_ms"], row["staged_ring_ms"])
        row["staging_bound_ms"] = 1.3 * best_host + row["d2h_ms"] + row["h2d_ms"]
        row["staged_vs_bound"] = best_staged / row["staging_bound_ms"]
        row["cuda_ipc_vs_staged"] = (None if row["cuda_ipc_ms"] is None
                                     else row["cuda_ipc_ms"] / best_staged)
        row["pinned_GBps"] = nbytes / (row["d2h_ms"] * 1e6)
        rows.append(row)
    return rows


def print_allreduce(rows: list[dict]) -> None:
    t = Table([("MiB", 5, ".0f"), ("staged shm", 10, ".2f"), ("host shm", 8, ".2f"),
               ("staged ring", 11, ".2f"), ("host ring", 9, ".2f"), ("cuda_ipc", 8, ".2f"),
               ("dev copy", 8, ".3f"), ("d2h", 6, ".2f"), ("h2d", 6, ".2f"),
               ("bound", 6, ".2f"), ("staged/bound", 12, ".2f"), ("ipc/staged", 10, ".2f")])
    print(f"# device all-reduce (float32, avg), ms, {rows[0]['ranks'] if rows else '?'} ranks; "
          "bound = 1.3 x host + d2h + h2d (target: staged/bound <= 1; ipc/staged <= 0.5)")
    print(t.header())
    for r in rows:
        print(t.row(r["bytes"] / (1 << 20), r["staged_shm_ms"], r["host_shm_ms"],
                    r["staged_ring_ms"], r["host_ring_ms"], r["cuda_ipc_ms"],
                    r["device_copy_ms"], r["d2h_ms"], r["h2d_ms"], r["staging_bound_ms"],
                    r["staged_vs_bound"], r["cuda_ipc_vs_staged"]))


# ----------------------------------------------------------------------------- step phases

def _mlp_layers(nn: Any, widths: list[int]) -> list[Any]:
    layers: list[Any] = []
    for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if k < len(widths) - 2:
            layers.append(nn.ReLU())
    return layers


def minidist_phases(device: str, sync: Callable[[], None], widths: list[int], batch: int,
                    repeats: int) -> dict:
    import minidist
    from minidist import amp, nn, optim
    from minidist.tensor import Tensor

    model = nn.Sequential(*_mlp_layers(nn, widths)).to(device)
    rng = np.random.default_rng(0)
    x = Tensor(minidist.xp.move(rng.standard_normal((batch, widths[0])).astype(np.float32),
                                device))
    y = Tensor(minidist.xp.move(rng.integers(0, widths[-1], batch), device))
    loss_fn = nn.CrossEntropyLoss()
    out: dict[str, float] = {}
    out["forward_ms"] = median_ms(lambda: model(x), sync, repeats)

    def fwd_bwd() -> None:
        for p in model.parameters():
            p.grad = None
        loss_fn(model(x), y).backward()
    out["fwd_bwd_ms"] = median_ms(fwd_bwd, sync, repeats)
    fwd_bwd()
    for fused in (False, True):
        opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=fused)
        out["opt_fused_ms" if fused else "opt_ms"] = median_ms(opt.step, sync, repeats)
    opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=True)
    scaler = amp.GradScaler(device)

    def amp_step() -> None:  # autocast forward + loss, scaled backward, unscale + step, update
        opt.zero_grad()
        with amp.autocast(device):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    out["amp_step_ms"] = median_ms(amp_step, sync, repeats)
    return out


def torch_phases(torch: Any, device: str, widths: list[int], batch: int, repeats: int) -> dict:
    dev = torch.device(device)
    model = torch.nn.Sequential(*_mlp_layers(torch.nn, widths)).to(dev)
    x = torch.randn(batch, widths[0], device=dev)
    y = torch.randint(0, widths[-1], (batch,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out: dict[str, float] = {}
    out["forward_ms"] = median_ms(lambda: model(x), sync, repeats)  # grad mode, as minidist

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
    out["fwd_bwd_ms"] = median_ms(fwd_bwd, sync, repeats)
    fwd_bwd()
    for kind in ("foreach", "fused"):
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, **{kind: True})
        out[f"opt_{kind}_ms"] = median_ms(opt.step, sync, repeats)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=True)
    scaler = torch.amp.GradScaler(device)

    def amp_step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    out["amp_step_ms"] = median_ms(amp_step, sync, repeats)
    return out


def step_rows(device: str, sync: Callable[[], None], models: list[str], repeats: int,
              use_torch: bool) -> list[dict]:
    torch = None
    if use_torch:
        try:
            import torch  # type: ignore[no-redef]
            if device == "cuda" and not torch.cuda.is_available():
                print("# torch does not see the GPU: its columns are left out")
                torch = None
        except ImportError:
            print("# torch is not importable here: its columns are left out")
    rows = []
    for name in models:
        widths, batch = MLPS[name]
        row: dict[str, Any] = {"model": name, "widths": widths, "batch": batch}
        row.update({f"minidist_{k}": v for k, v in
                    minidist_phases(device, sync, widths, batch, repeats).items()})
        if torch is not None:
            row.update({f"torch_{k}": v for k, v in
                        torch_phases(torch, device, widths, batch, repeats).items()})
            t_opt = min(row["torch_opt_foreach_ms"], row["torch_opt_fused_ms"])
            m_opt = min(row["minidist_opt_ms"], row["minidist_opt_fused_ms"])
            row["step_vs_torch"] = (row["minidist_fwd_bwd_ms"] + m_opt) / (
                row["torch_fwd_bwd_ms"] + t_opt)
            row["opt_vs_torch"] = m_opt / t_opt
            row["amp_step_vs_torch"] = row["minidist_amp_step_ms"] / row["torch_amp_step_ms"]
        rows.append(row)
    return rows


def print_steps(rows: list[dict]) -> None:
    t = Table([("model", 25, "s"), ("fwd", 6, ".2f"), ("torch", 6, ".2f"), ("fwd+bwd", 7, ".2f"),
               ("torch", 6, ".2f"), ("opt", 6, ".2f"), ("fused", 6, ".2f"), ("torch", 6, ".2f"),
               ("amp step", 8, ".2f"), ("torch", 6, ".2f"), ("step/torch", 10, ".2f"),
               ("opt/torch", 9, ".2f"), ("amp/torch", 9, ".2f")])
    print("# one training step by phase, ms (SGD momentum; torch: its faster of foreach and "
          "fused); targets fp32: wide <= 1.15x, deep <= 1.5x; AMP <= 1.3x, <= 1.8x; "
          "optimizer <= 1.2x")
    print(t.header())
    for r in rows:
        topt = (None if "torch_opt_fused_ms" not in r
                else min(r["torch_opt_foreach_ms"], r["torch_opt_fused_ms"]))
        print(t.row(r["model"], r["minidist_forward_ms"], r.get("torch_forward_ms"),
                    r["minidist_fwd_bwd_ms"], r.get("torch_fwd_bwd_ms"), r["minidist_opt_ms"],
                    r["minidist_opt_fused_ms"], topt, r["minidist_amp_step_ms"],
                    r.get("torch_amp_step_ms"), r.get("step_vs_torch"), r.get("opt_vs_torch"),
                    r.get("amp_step_vs_torch")))


# ----------------------------------------------------------------------------- ipc, ddp

def ipc_section(data: dict, sections: list[str], repeats: int, rank: int) -> None:
    """The "ipc" and "ddp" sections (benchmarks/gpu_allreduce.py), recorded in ``data``."""
    import gpu_allreduce
    from minidist import comm

    group = comm.get_default_group()
    cp = backend.require_cuda()
    sync = cp.cuda.get_current_stream().synchronize
    try:
        rows = (gpu_allreduce.allreduce_rows(group, cp, sync, gpu_allreduce.SIZES, repeats,
                                             False) if "ipc" in sections else [])
        ddp = (gpu_allreduce.ddp_rows(group, "cuda", sync, "wide", repeats, False)
               if "ddp" in sections else [])
        judged = gpu_allreduce.targets(rows, ddp)
        data["sections"]["ipc"] = {"rows": rows, "ddp_rows": ddp, "targets": judged}
        if rank == 0:
            gpu_allreduce.print_rows(rows, ddp, judged)
    except Exception as exc:  # record and go on
        data["sections"]["ipc"] = {"error": f"{type(exc).__name__}: {exc}",
                                   "traceback": traceback.format_exc()}
        print(f"# ipc/ddp failed on rank {rank}: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default="allreduce,ipc,ddp,step",
                    help="allreduce, ipc, ddp, step")
    ap.add_argument("--sizes", default="1M,16M,64M", help="all-reduce sizes (bytes)")
    ap.add_argument("--repeats", type=int, default=20, help="timed repeats (median)")
    ap.add_argument("--models", default="small,wide,deep", help="step rows: small, wide, deep")
    ap.add_argument("--no-torch", action="store_true", help="leave torch's columns out")
    ap.add_argument("--out", default=str(LOCAL_RESULTS), help="folder for gpu_training.json")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="run the step section on the CPU (checks this script; not a result)")
    a = ap.parse_args(argv)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    if a.cpu_dry_run:
        rows = step_rows("cpu", lambda: None, models, a.repeats, not a.no_torch)
        print_steps(rows)
        path = write_json(Path(a.out) / "gpu_training.json",
                          {"benchmark": "gpu_training", "dry_run_cpu": True, "args": vars(a),
                           "sections": {"step": {"rows": rows}}, "machine": machine_info()})
        print(f"# wrote {shown(path)} (CPU dry run: not a GPU result)")
        return 0
    if not backend.gpu_available():
        if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) != "0":
            return 0  # under mpiexec: rank 0 says it once
        print("# gpu_training: no CUDA GPU here (CuPy missing, or cupy.cuda.is_available() is "
              "False): nothing measured")
        return 0
    cp = backend.require_cuda()
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    rank, world = 0, 1
    if under_mpi():
        from minidist import comm

        comm.init_process_group(backend="mpi")
        rank, world = comm.get_rank(), comm.get_world_size()
        cp.cuda.Device(comm.get_local_rank() % cp.cuda.runtime.getDeviceCount()).use()
    data: dict[str, Any] = {"benchmark": "gpu_training", "args": vars(a), "world": world,
                            "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                            "machine": machine_info(), "sections": {}}
    if "allreduce" in sections:
        if world < 2:
            print("# allreduce: needs >= 2 ranks (mpiexec -n 2 ...): skipped")
        else:
            try:
                rows = allreduce_rows(cp, [parse_bytes(s) for s in a.sizes.split(",")],
                                      a.repeats)
                data["sections"]["allreduce"] = {"rows": rows}
                if rank == 0:
                    print_allreduce(rows)
            except Exception as exc:  # record and go on: the other section still runs
                data["sections"]["allreduce"] = {"error": f"{type(exc).__name__}: {exc}",
                                                 "traceback": traceback.format_exc()}
                print(f"# allreduce failed on rank {rank}: {type(exc).__name__}: {exc}")
    if world >= 2 and ("ipc" in sections or "ddp" in sections):
        ipc_section(data, sections, a.repeats, rank)
    if "step" in sections and rank == 0:
        try:
            rows = step_rows("cuda", cp.cuda.Device().synchronize, models, a.repeats,
                             not a.no_torch)
            data["sections"]["step"] = {"rows": rows}
            print_steps(rows)
        except Exception as exc:
            data["sections"]["step"] = {"error": f"{type(exc).__name__}: {exc}",
                                        "traceback": traceback.format_exc()}
            print(f"# step failed: {type(exc).__name__}: {exc}")
    if rank == 0:
        path = write_json(Path(a.out) / "gpu_training.json", data)
        print(f"# wrote {shown(path)}")
    if under_mpi():
        from minidist import comm

        comm.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
