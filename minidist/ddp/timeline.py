"""What DistributedDataParallel records on the step timeline (minidist/tracing.py)."""

from __future__ import annotations

from typing import Any

from minidist import comm
from minidist import tracing as trace


def trace_all_reduce(ddp: Any, tr: trace.Tracer, array: Any, op: str, t0: float,
                     t1: float) -> None:
    """One all-reduce on the communication lane: bytes, algorithm, bus bandwidth.

    busbw = 2(n-1)/n x bytes / time: what each rank's link carried per second by the
    bandwidth-optimal (ring) schedule, comparable across world sizes (nccl-tests' busbw).
    """
    n = ddp.world_size
    index = next((b.index for b in ddp.buckets if b.buffer is array), None)
    if index is not None:
        name, algo = f"all_reduce bucket {index}", ddp.reducer.bucket_algorithms[index]
    else:  # a comm hook's own array (fp16 copy, PowerSGD factors)
        group = ddp.process_group or comm.get_default_group()
        name, algo = "all_reduce", group.plan_all_reduce(array, ddp.algorithm).algorithm
    busbw = 2 * (n - 1) / n * array.nbytes / max(t1 - t0, 1e-9) / 1e9 if n > 1 else 0.0
    args = {"step": ddp.reducer.num_syncs, "bytes": int(array.nbytes), "algorithm": algo,
            "op": op, "busbw_GBps": round(busbw, 3)}
    if index is not None:
        args["bucket"] = index
    tr.complete(name, t0, t1, lane=trace.COMM, cat="allreduce", args=args)


__all__ = ["trace_all_reduce"]
