"""Device all-reduce at the copy bound: cuda_ipc, host_copy and auto beside one device copy,
and DDP's step of the wide MLP on two ranks sharing a GPU (cuda_ipc / staged / one rank).

    mpiexec -n 2 python benchmarks/gpu_allreduce.py              # two ranks sharing GPU 0
    mpiexec -n 2 python benchmarks/gpu_allreduce.py --cpu        # the CPU twin (host windows)
    mpiexec -n 2 python benchmarks/gpu_training.py --sections ipc,ddp   # the same rows there

Rows (float32, op avg, medians over ``--repeats``, each repeat after a barrier and timed until
the stream is done, on rank 0), at 4 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB:

    cuda_ipc   algorithm="cuda_ipc" (stream-ordered flags; MINIDIST_IPC_ORDER=host to compare)
    host_copy  copy down to pinned memory, host all-reduce, copy up
    auto       what "auto" runs for the device buffer (named in the row), and its time
    host       "auto" on a host buffer of the same bytes
    d2h, h2d   one pinned copy each way;  copy: one device-to-device copy of the buffer

and the targets, each judged pass/fail: cuda_ipc <= 60 us at 4 B and 4 KiB; <= 2 x one device
copy at 16 and 64 MiB; auto <= 1.3 x (host + d2h + h2d) at 1 MiB; the DDP step with cuda_ipc
<= 1.2 x the one-rank step. ``--cpu`` runs the same code on host buffers ("ipc_host": cuda_ipc's
protocol on MPI shared windows, copies = ``np.copyto``, the small MLP): it checks the script
and times the protocol's host cost, not a GPU; it judges no target. Without a GPU (and without
``--cpu``) it prints one line and exits 0. JSON: ``gpu_allreduce.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import LOCAL_RESULTS, machine_info, shown, write_json  # noqa: E402

from minidist import xp as backend  # noqa: E402

SIZES = [4, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
CPU_SIZES = [4, 4 << 10, 64 << 10, 1 << 20]
MLPS = {"wide": ([1024, 4096, 4096, 1000], 512), "small": ([64, 128, 10], 64)}


def median_us(fn: Callable[[], None], sync: Callable[[], None], repeats: int,
              barrier: Callable[[], None] | None = None) -> float:
    fn()
    sync()  # warm-up: windows, plans, compiles
    samples = []
    for _ in range(repeats):
        if barrier is not None:
            barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def allreduce_rows(group: Any, xp: Any, sync: Callable[[], None], sizes: list[int],
                   repeats: int, cpu: bool) -> list[dict]:
    """One row per size (module docstring); ``xp``: CuPy, or NumPy for ``--cpu``."""
    ipc = "ipc_host" if cpu else "cuda_ipc"
    rows = []
    for nbytes in sizes:
        numel = max(nbytes // 4, 1)
        dev = xp.ones(numel, np.float32)
        host = np.ones(numel, np.float32)
        other = xp.empty_like(dev)
        row: dict[str, Any] = {"bytes": nbytes, "ranks": group.size}

        def time_it(fn: Callable[[], None]) -> float:
            return median_us(fn, sync, repeats, group.barrier)
        row["cuda_ipc_us"] = time_it(lambda: group.all_reduce(dev, op="avg", algorithm=ipc))
        row["host_copy_us"] = None if cpu else time_it(
            lambda: group.all_reduce(dev, op="avg", algorithm="host_copy"))
        row["auto_algorithm"] = group.plan_all_reduce(dev, "auto").algorithm
        row["auto_us"] = time_it(lambda: group.all_reduce(dev, op="avg"))
        row["host_us"] = time_it(lambda: group.all_reduce(host, op="avg"))
        row["copy_us"] = median_us(lambda: xp.copyto(other, dev), sync, repeats)
        if cpu:
            row["d2h_us"] = row["h2d_us"] = 0.0
        else:
            import cupyx

            pin = cupyx.empty_pinned((numel,), np.float32)
            row["d2h_us"] = median_us(lambda: dev.get(out=pin), sync, repeats)
            row["h2d_us"] = median_us(lambda: dev.set(pin), sync, repeats)
        row["cuda_ipc_vs_copy"] = row["cuda_ipc_us"] / row["copy_us"]
        row["auto_bound_us"] = 1.3 * row["host_us"] + row["d2h_us"] + row["h2d_us"]
        row["auto_vs_bound"] = row["auto_us"] / row["auto_bound_us"]
        rows.append(row)
    return rows


def ddp_rows(group: Any, device: str, sync: Callable[[], None], model_name: str,
             repeats: int, cpu: bool) -> list[dict]:
    """The step (forward, backward, fused SGD) of an MLP: DDP over two ranks with cuda_ipc and
    with staging ("ring"), and one rank alone (no DDP; the other rank waits)."""
    import minidist
    from minidist import nn, optim
    from minidist.ddp import DistributedDataParallel
    from minidist.tensor import Tensor

    widths, batch = MLPS[model_name]
    rng = np.random.default_rng(group.rank)
    x = Tensor(minidist.xp.move(rng.standard_normal((batch, widths[0])).astype(np.float32),
                                device))
    y = Tensor(minidist.xp.move(rng.integers(0, widths[-1], batch), device))

    def build() -> Any:
        nn.manual_seed(0)
        layers: list[Any] = []
        for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            layers += [nn.Linear(a, b)] + ([nn.ReLU()] if k < len(widths) - 2 else [])
        return nn.Sequential(*layers).to(device)

    def step_ms(model: Any, wrapped: Any, barrier: Any = group.barrier) -> float:
        opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=True)

        def step() -> None:
            opt.zero_grad()
            nn.CrossEntropyLoss()(wrapped(x), y).backward()
            opt.step()
        return median_us(step, sync, repeats, barrier) / 1e3

    row: dict[str, Any] = {"model": model_name, "ranks": group.size}
    for name, algorithm in (("cuda_ipc", "ipc_host" if cpu else "cuda_ipc"), ("staged", "ring")):
        model = build()
        ddp = DistributedDataParallel(model, algorithm=algorithm)
        row[f"{name}_ms"] = step_ms(model, ddp)
        ddp.close()
    model = build()
    one = step_ms(model, model, None) if group.rank == 0 else None
    group.barrier()
    row["one_rank_ms"] = one
    if one:
        row["cuda_ipc_vs_one_rank"] = row["cuda_ipc_ms"] / one
        row["staged_vs_one_rank"] = row["staged_ms"] / one
    return [row]


def targets(rows: list[dict], ddp: list[dict]) -> list[dict]:
    """Pass/fail of each target the rows measure (module docstring)."""
    out = []
    for r in rows:
        b = r["bytes"]
        if b <= 4 << 10:
            out.append({"target": f"cuda_ipc <= 60 us ({b} B)", "pass": r["cuda_ipc_us"] <= 60,
                        "detail": f"{r['cuda_ipc_us']:.1f} us"})
        if b in (16 << 20, 64 << 20):
            out.append({"target": f"cuda_ipc <= 2 x one device copy ({b >> 20} MiB)",
                        "pass": r["cuda_ipc_vs_copy"] <= 2.0,
                        "detail": f"{r['cuda_ipc_vs_copy']:.2f} x ({r['copy_us']:.0f} us copy)"})
        if b == 1 << 20:
            out.append({"target": "auto <= 1.3 x host + d2h + h2d (1 MiB)",
                        "pass": r["auto_vs_bound"] <= 1.0,
                        "detail": f"{r['auto_vs_bound']:.2f} of the bound ({r['auto_algorithm']})"})
    for r in ddp:
        if r.get("cuda_ipc_vs_one_rank") is not None:
            out.append({"target": f"DDP step with cuda_ipc <= 1.2 x one rank ({r['model']} MLP)",
                        "pass": r["cuda_ipc_vs_one_rank"] <= 1.2,
                        "detail": f"{r['cuda_ipc_vs_one_rank']:.2f}"})
    return out


def print_rows(rows: list[dict], ddp: list[dict], judged: list[dict]) -> None:
    print("# device all-reduce (float32, avg), us, medians; bound = 1.3 x host + d2h + h2d")
    print(f"# {'bytes':>9s} {'cuda_ipc':>9s} {'host_copy':>9s} {'auto':>9s} {'(algo)':>10s} "
          f"{'host':>8s} {'d2h':>7s} {'h2d':>7s} {'copy':>8s} {'ipc/copy':>8s} {'auto/bnd':>8s}")
    for r in rows:
        hc = "-" if r["host_copy_us"] is None else f"{r['host_copy_us']:.1f}"
        print(f"  {r['bytes']:>9d} {r['cuda_ipc_us']:>9.1f} {hc:>9s} {r['auto_us']:>9.1f} "
              f"{r['auto_algorithm']:>10s} {r['host_us']:>8.1f} {r['d2h_us']:>7.1f} "
              f"{r['h2d_us']:>7.1f} {r['copy_us']:>8.1f} {r['cuda_ipc_vs_copy']:>8.2f} "
              f"{r['auto_vs_bound']:>8.2f}")
    for r in ddp:
        print(f"# DDP step, {r['model']} MLP, ms: cuda_ipc {r['cuda_ipc_ms']:.2f}, staged "
              f"{r['staged_ms']:.2f}, one rank {r['one_rank_ms']:.2f}"
              + (f" (cuda_ipc / one rank {r['cuda_ipc_vs_one_rank']:.2f})"
                 if r.get("cuda_ipc_vs_one_rank") else ""))
    for t in judged:
        print(f"# target {'PASS' if t['pass'] else 'FAIL'}: {t['target']}: {t['detail']}")


def run(group: Any, cpu: bool, repeats: int, sizes: list[int] | None = None,
        model: str | None = None) -> dict:
    """Every row and target on ``group`` (collective); the dict gpu_training/gpu_check keep."""
    if cpu:
        xp, device, sync = np, "cpu", (lambda: None)
    else:
        xp, device = backend.require_cuda(), "cuda"
        sync = xp.cuda.get_current_stream().synchronize
    rows = allreduce_rows(group, xp, sync, sizes or (CPU_SIZES if cpu else SIZES), repeats, cpu)
    ddp = ddp_rows(group, device, sync, model or ("small" if cpu else "wide"), repeats, cpu)
    judged = [] if cpu else targets(rows, ddp)
    return {"rows": rows, "ddp_rows": ddp, "targets": judged, "cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the CPU twin: host windows, no GPU")
    ap.add_argument("--repeats", type=int, default=30, help="timed repeats (median)")
    ap.add_argument("--out", default=str(LOCAL_RESULTS), help="folder for gpu_allreduce.json")
    a = ap.parse_args(argv)
    if not a.cpu and not backend.gpu_available():
        if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
            print("# gpu_allreduce: no CUDA GPU here (CuPy missing, or cupy.cuda.is_available() "
                  "is False): nothing measured (--cpu runs the CPU twin)")
        return 0
    from minidist import comm

    group = comm.init_process_group(backend="mpi")
    if group.size < 2:
        print("# gpu_allreduce: needs 2 ranks (mpiexec -n 2 ...): nothing measured")
        comm.destroy_process_group()
        return 0
    if not a.cpu:
        cp = backend.require_cuda()
        cp.cuda.Device(comm.get_local_rank() % cp.cuda.runtime.getDeviceCount()).use()
    data = run(group, a.cpu, a.repeats)
    if group.rank == 0:
        print_rows(data["rows"], data["ddp_rows"], data["targets"])
        path = write_json(Path(a.out) / "gpu_allreduce.json",
                          {"benchmark": "gpu_allreduce", "args": vars(a),
                           "machine": machine_info(), **data})
        print(f"# wrote {shown(path)}")
    comm.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
