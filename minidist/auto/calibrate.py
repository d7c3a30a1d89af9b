"""Calibrating "auto" for this machine: measure, fit select.py's model and rules, cache them.

    python -m minidist.tune                       # one rank: nothing to measure; see below
    ./mpirun.sh -n 2 python -m minidist.tune      # MPI transport, 2 ranks: a few seconds
    python -m minidist.launch --nproc-per-node 2 -m minidist.tune   # TCP transport

The shipped table (``auto_defaults.json``, package data) was fitted on one development
machine, so it suits machines like that one only. A calibration times
every candidate algorithm of this machine, transport and world size at a sweep of message
sizes (interleaved, each call after a barrier; a call's time is the slowest rank's), then fits
the same two things the shipped table holds:

    rules  per world size and buffer kind ("2": plain, "2s": a buffer in a shared window,
           "2d": a device buffer, on a GPU "cuda_ipc" serves: "host_copy" vs "cuda_ipc"):
           [[upper_bytes, algorithm], ..., [None, algorithm]]   (``size_rules``)
    model  alpha (us per message), beta (us per byte), gamma (us per byte reduced) for each
           algorithm, least squares over the measured points  (``fit_model``)

and writes them as JSON to the cache (``cache_path``)::

    $MINIDIST_CACHE_DIR (default $XDG_CACHE_HOME/minidist or ~/.cache/minidist)
      allreduce-<host>-<transport>-n<world size>.json
      {"format": 1, "key": {"host", "transport", "world_size", "version"}, "model", "rules",
       "created", "quick", "times_us": {...}}

Every ``ProcessGroup`` looks for the file of its own key when it is made (``agreed``). On the
MPI transport the ranks compare a digest of what they loaded (an MPI allreduce on the
communicator, beside the shared-memory set-up that makes construction collective there), and
"auto" uses the calibration only when every rank holds the same one; otherwise the shipped
table. Other transports send nothing at construction: each rank reads the file of its own
host, which is the same file for every rank of a one-host job (ranks on several hosts need
the same calibration on each host; a differing choice makes the call fingerprints differ, so
the collective fails with the ledger's diagnosis instead of mixing algorithms). A corrupt file, or
one made for another version, host, transport or world size, is ignored with one warning that names
the file and the command that regenerates it. ``MINIDIST_TUNE=0`` ignores the cache,
``MINIDIST_TUNE=1`` runs a quick calibration when no file matches (at the process group's creation:
all ranks take part). ``MINIDIST_DEBUG=1`` logs which table "auto" uses.

The cache files themselves (key, validation, load, save): calibration_cache.py.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.auto import select
from minidist.fastpath.cuda_ipc import cuda_ipc_available
from minidist.fastpath.host_copy import DEVICE_CANDIDATES
from minidist.logger import get_logger
from minidist.envvars import env
from minidist.auto.calibration_cache import (COMMAND, FORMAT, Calibration,  # noqa: F401
                                             cache_dir, cache_key, cache_path, digest, load,
                                             regenerate_hint, save, validate, warned_paths)

log = get_logger(__name__)

TOLERANCE = 0.05  # algorithms within 5 % of the fastest (median) count as tied


def tune_mode() -> str:
    """``MINIDIST_TUNE``: "off" (0: ignore the cache), "use" (unset: use a matching file),
    "run" (1: use one, or calibrate quickly when none matches)."""
    return str(env("MINIDIST_TUNE"))


def agreed(group: Any) -> Calibration | None:
    """The calibration every rank of ``group`` loaded alike, or None: the shipped table.

    COLLECTIVE (called by ``ProcessGroup`` when it is made; see the module docstring for what
    each transport compares). ``MINIDIST_TUNE=1`` and no match anywhere: run a quick
    calibration now (``calibrate``), cache it and use it.
    """
    mode = tune_mode()
    transport, n = group.transport.name, group.size
    if mode == "off" or n < 2:
        return None
    mine = load(transport, n, warn=group.rank == 0)
    d = mine.digest if mine is not None else 0
    mpi = group.transport.mpi
    if mpi is not None:  # MPI: compare, no transport message
        lo, hi = -mpi.comm.allreduce(-d, op=mpi.MPI.MAX), mpi.comm.allreduce(d, op=mpi.MPI.MAX)
    else:  # one host (threads), or TCP: each host reads its own file (see the module doc)
        lo = hi = d
    if lo != hi and group.rank == 0:
        log.warning("auto: the ranks hold different calibrations, so every rank uses the "
                    "shipped table. Calibrate with every rank's host alike: %s.",
                    regenerate_hint(transport, n))
    if lo == hi and d:
        return mine
    if mode == "run" and hi == 0:
        return calibrate(group, quick=True)
    return None


# ---------------------------------------------------------------- measuring and fitting

def size_rules(times: dict[int, dict[str, float]], tol: float = TOLERANCE) -> list:
    """A few clean thresholds ``[[upper_bytes or None, algorithm], ...]`` from per-size times.

    Greedy from small to large: a segment keeps every algorithm that is within ``tol`` of the
    fastest at each of its sizes; when no algorithm is left, a new segment starts. Each segment
    takes its algorithm with the lowest mean time/fastest ratio; the threshold between two
    segments is the geometric mean of the neighbouring sizes. Ties within noise therefore
    extend the current choice instead of flipping back and forth (conservative, few cuts).

        >>> size_rules({8: {"mpi": 5.0, "ring": 9.0}, 1 << 20: {"mpi": 300.0, "ring": 200.0}})
        [[2896, 'mpi'], [None, 'ring']]
    """
    sizes_ = sorted(times)
    segs: list = []  # [first index, last index, still-allowed set]
    for i, s in enumerate(sizes_):
        best = min(times[s].values())
        ok = {a for a, t in times[s].items() if t <= best * (1 + tol)}
        if segs and segs[-1][2] & ok:
            segs[-1][1], segs[-1][2] = i, segs[-1][2] & ok
        else:
            segs.append([i, i, ok])
    rules: list = []
    for k, (i0, i1, ok) in enumerate(segs):
        pts = sizes_[i0:i1 + 1]
        algo = min(sorted(ok), key=lambda a: sum(times[s][a] / min(times[s].values())
                                                 for s in pts))
        upper = (None if k == len(segs) - 1
                 else int(round((sizes_[i1] * sizes_[i1 + 1]) ** 0.5)))
        if rules and rules[-1][1] == algo:
            rules[-1][0] = upper
        else:
            rules.append([upper, algo])
    return rules


def fit_model(points: dict[str, list[tuple[int, int, float]]], gamma: float
              ) -> tuple[dict, list]:
    """alpha and beta per algorithm from ``{name: [(world_size, nbytes, us), ...]}``.

    Each cost formula of ``select.COST`` is linear in (alpha, beta, gamma); gamma is given (a
    NumPy add), alpha and beta are least squares on relative error. Returns ``(model,
    report)`` with report rows ``(name, alpha, beta, median |relative error|)``.
    """
    model, report = {}, []
    for name, pts in sorted(points.items()):
        pts = [p for p in pts if p[0] > 1]
        if name not in select.COST or len(pts) < 2:
            continue
        f = select.COST[name]
        a = np.array([[f(n, b, 1, 0, 0), f(n, b, 0, 1, 0)] for n, b, _ in pts])
        g = np.array([f(n, b, 0, 0, gamma) for n, b, _ in pts])
        y = np.array([t for *_, t in pts])
        w = 1.0 / y
        (alpha, beta), *_ = np.linalg.lstsq(a * w[:, None], (y - g) * w, rcond=None)
        alpha, beta = max(float(alpha), 0.1), max(float(beta), 1e-6)
        model[name] = {"alpha_us": alpha, "beta_us_per_byte": beta, "gamma_us_per_byte": gamma}
        pred = a @ np.array([alpha, beta]) + g
        report.append((name, alpha, beta, float(np.median(np.abs(pred - y) / y))))
    return model, report


def gamma_us_per_byte(nbytes: int = 4 << 20) -> float:
    """Microseconds per byte of an in-place float32 add of ``nbytes`` (the reduce cost)."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6 / nbytes


def _iters(nbytes: int, quick: bool) -> int:
    return max(3, min(15 if quick else 40, (16 << 20 if quick else 64 << 20) // max(nbytes, 1)))


QUICK_MAX_BYTES = 2 << 20   # sizes 8 B, 32 B, ... (x4): the quick sweep ends at 2 MiB
FULL_MAX_BYTES = 32 << 20   # --full: at 32 MiB


def measure(group: Any, quick: bool = True, max_bytes: int | None = None) -> dict:
    """Median time (us, slowest rank) of every candidate algorithm at each size, per buffer kind.

    COLLECTIVE. Returns ``{"plain": {nbytes: {algorithm: us}}, "shared": {...}, "device":
    {...}}`` ("shared": a buffer in a shared window, measured where the group has one;
    "device": a CuPy buffer, "cuda_ipc" against "host_copy", where a GPU and CUDA IPC serve the
    group, each call timed until its stream is done). The measurement runs unobserved
    (``calls.unobserved``, every rank alike): no ledger entries, and the user's call numbers
    are untouched.
    """
    from minidist.fastpath.shm import shm_alloc_buffer
    from minidist.fastpath.shm_window import shm_free_buffer

    max_bytes = max_bytes or (QUICK_MAX_BYTES if quick else FULL_MAX_BYTES)
    sizes, s = [], 8
    while s <= max_bytes:
        sizes.append(s)
        s *= 4
    count = max_bytes // 4
    kinds: dict[str, Any] = {"plain": np.zeros(count, np.float32)}
    names = group.planner.candidates(kinds["plain"])  # the registry's usable candidates
    if "shm" in names:
        kinds["shared"] = shm_alloc_buffer(group.transport, count, np.float32)
    base = np.random.default_rng(7 + group.rank).standard_normal(count).astype(np.float32)
    device = _device_kind(group, base)  # (buffer, source, sync) on a GPU "cuda_ipc" serves
    dev_source, dev_sync = (device[1], device[2]) if device is not None else (None, None)
    if device is not None:
        kinds["device"] = device[0]
    out: dict = {k: {} for k in kinds}
    buf = None
    try:
        with group.calls.unobserved():
            for nbytes in sizes:
                c, iters = nbytes // 4, _iters(nbytes, quick)
                runs = [(kind, name) for kind in kinds
                        for name in (DEVICE_CANDIDATES if kind == "device" else names)]
                local = np.zeros((len(runs), iters))
                for i in range(-1, iters):  # i = -1: one untimed warm-up round
                    for j in np.random.default_rng(i + 1).permutation(len(runs)):
                        kind, name = runs[j]
                        buf = kinds[kind][:c]
                        if dev_sync is not None and kind == "device":
                            buf[...] = dev_source[:c]  # type: ignore[index]
                            dev_sync()  # the copy in is done before the clock starts
                        else:
                            buf[...] = base[:c]
                        group.barrier()
                        t0 = time.perf_counter()
                        group.all_reduce(buf, algorithm=name)
                        if dev_sync is not None and kind == "device":
                            dev_sync()  # stream-ordered results: the call ends when they are in
                        if i >= 0:
                            local[j, i] = time.perf_counter() - t0
                slowest = group.all_gather(local.reshape(-1)).max(axis=0).reshape(local.shape)
                for (kind, name), row in zip(runs, slowest):
                    out[kind].setdefault(nbytes, {})[name] = float(np.median(row)) * 1e6
    finally:
        if "shared" in kinds:
            buf = None  # no view of the window may outlive it
            shm_free_buffer(group.transport, kinds.pop("shared"))
    return out


def _device_kind(group: Any, base: np.ndarray) -> tuple[Any, Any, Any] | None:
    """``(device buffer, its source, stream sync)`` when the group can run "cuda_ipc" on a
    device buffer here (a GPU, ranks on one node), else None. Collective (same answer on
    every rank: each asks the same question of the same transport)."""
    if not backend.gpu_available():
        return None
    cupy = backend.require_cuda()
    probe = cupy.zeros(1, np.float32)
    if not cuda_ipc_available(group.transport, probe):
        return None
    sync = cupy.cuda.get_current_stream().synchronize
    return cupy.zeros(base.size, np.float32), cupy.asarray(base), sync


def fit(times: dict, world_size: int) -> tuple[dict, dict, list]:
    """``(model, rules, report)`` from ``measure``'s times for one world size.

    The rules cover what was measured; past twice the largest size timed, "auto" does not
    extrapolate them but uses the shipped table (``Calibration.covers``).
    """
    points: dict = {}
    for nbytes, row in times.get("plain", {}).items():
        for name, us in row.items():
            points.setdefault(name, []).append((world_size, int(nbytes), us))
    for nbytes, row in times.get("shared", {}).items():  # shm on a shared buffer: shm_zc
        if "shm" in row:
            points.setdefault("shm_zc", []).append((world_size, int(nbytes), row["shm"]))
    for nbytes, row in times.get("device", {}).items():  # cuda_ipc and host_copy, on a GPU
        for name, us in row.items():
            points.setdefault(name, []).append((world_size, int(nbytes), us))
    model, report = fit_model(points, gamma_us_per_byte())
    rules = {}
    for kind, suffix in (("plain", ""), ("shared", "s"), ("device", "d")):
        if not times.get(kind):
            continue
        rules[f"{world_size}{suffix}"] = size_rules(times[kind])
    return model, rules, report


def calibrate(group: Any, quick: bool = True, max_bytes: int | None = None,
              write: bool = True) -> Calibration:
    """Measure, fit, cache (rank 0 writes) and return the calibration of ``group``'s key.

    COLLECTIVE. Every rank ends with the same Calibration (rank 0's fit is broadcast, so a
    floating-point difference between ranks can never make them choose differently).
    """
    t0 = time.perf_counter()
    times = measure(group, quick, max_bytes)
    transport, n = group.transport.name, group.size
    data = None
    if group.rank == 0:
        model, rules, report = fit(times, n)
        data = {"format": FORMAT, "key": cache_key(transport, n), "model": model,
                "rules": rules, "quick": quick,
                "measured_bytes": max(int(s) for v in times.values() for s in v),
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"),
                "elapsed_s": round(time.perf_counter() - t0, 3),
                "times_us": {k: {str(s): row for s, row in v.items()} for k, v in times.items()},
                "fit_error": {name: err for name, _, _, err in report}}
    with group.calls.unobserved():
        data = group.broadcast_object(data, src=0)
    path = cache_path(transport, n)
    if write and group.rank == 0:
        try:
            save(data, path)
        except OSError as e:
            log.warning("auto: could not write the calibration to %s (%s); it is used by this "
                        "job only. Set MINIDIST_CACHE_DIR to a writable directory.", path, e)
    if write:  # the file exists before any rank goes on (a group made next reads it)
        with group.calls.unobserved():
            group.barrier()
    data["key"] = cache_key(transport, n)  # this rank's own host (the file holds rank 0's)
    return Calibration(data["key"], data["model"], data["rules"], path if write else None,
                       digest(data["model"], data["rules"]), data.get("measured_bytes"))


__all__ = ["Calibration", "cache_dir", "cache_key", "cache_path", "load", "save", "agreed",
           "calibrate", "measure", "fit", "fit_model", "size_rules", "tune_mode",
           "regenerate_hint"]
