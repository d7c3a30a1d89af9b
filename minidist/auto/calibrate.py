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
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from minidist import xp as backend
from minidist.auto import select
from minidist.fastpath.cuda_ipc import cuda_ipc_available
from minidist.fastpath.host_copy import DEVICE_CANDIDATES
from minidist.logger import get_logger
from minidist.user_cache import user_cache_dir
from minidist.version import __version__
from minidist.envvars import env

log = get_logger(__name__)

FORMAT = 1
TOLERANCE = 0.05  # algorithms within 5 % of the fastest (median) count as tied
COMMAND = {"mpi": "./mpirun.sh -n {n} python -m minidist.tune",
           "tcp": "python -m minidist.launch --nproc-per-node {n} -m minidist.tune"}


@dataclasses.dataclass(frozen=True, eq=False)
class Calibration:
    """A loaded calibration: select.py's ``model`` and ``rules`` for one key, and its file."""

    key: dict
    model: dict
    rules: dict
    path: Path | None
    digest: int
    measured_bytes: int | None = None  # the largest size timed (None: a file without it)

    def covers(self, nbytes: int) -> bool:
        """Whether ``nbytes`` lies within what was measured (up to twice the largest size
        timed: the sweep's own spacing); beyond, "auto" uses the shipped table instead of
        extrapolating the calibration."""
        return self.measured_bytes is None or nbytes < 2 * self.measured_bytes

    def describe(self) -> str:
        """``calibration ~/.cache/minidist/allreduce-h-mpi-n2.json`` (for logs and reasons)."""
        return f"calibration {self.path}" if self.path else "calibration (in memory)"


# ---------------------------------------------------------------- the cache

def cache_dir() -> Path:
    """``MINIDIST_CACHE_DIR``, else ``$XDG_CACHE_HOME/minidist``, else ``~/.cache/minidist``
    (``minidist.user_cache``: the compiled kernels live there too)."""
    return user_cache_dir()


def cache_key(transport: str, world_size: int) -> dict:
    """What a calibration is valid for: this host, transport, world size and minidist version."""
    return {"host": socket.gethostname(), "transport": str(transport),
            "world_size": int(world_size), "version": __version__}


def cache_path(transport: str, world_size: int) -> Path:
    """The cache file of ``cache_key(transport, world_size)``."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return cache_dir() / f"allreduce-{host}-{transport}-n{int(world_size)}.json"


def regenerate_hint(transport: str, world_size: int) -> str:
    """The command that writes a fresh calibration for this key."""
    cmd = COMMAND.get(transport, COMMAND["mpi"]).format(n=world_size)
    return f"regenerate it with `{cmd}` (or delete the file)"


def digest(model: dict, rules: dict) -> int:
    """A 63-bit digest of a calibration's content (what the ranks compare)."""
    text = json.dumps({"model": model, "rules": rules}, sort_keys=True)
    return zlib.crc32(text.encode()) | (len(text) << 32)


def validate(data: Any, key: dict) -> str | None:
    """Why ``data`` (a parsed cache file) cannot be used for ``key``, or None when it can."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a minidist calibration of format {FORMAT}"
    if data.get("key") != key:
        got = data.get("key")
        diff = ([f"{k}={got.get(k)!r} (here {v!r})" for k, v in key.items() if got.get(k) != v]
                if isinstance(got, dict) else [f"key={got!r}"])
        return "made for another " + ", ".join(diff)
    model, rules = data.get("model"), data.get("rules")
    if not isinstance(model, dict) or not isinstance(rules, dict):
        return "it lacks 'model' or 'rules'"
    for name, consts in model.items():
        if name not in select.COST:
            return f"unknown algorithm {name!r} in its model"
        if not isinstance(consts, dict) or any(
                not isinstance(consts.get(c), (int, float)) or not consts[c] >= 0
                for c in ("alpha_us", "beta_us_per_byte", "gamma_us_per_byte")):
            return f"the model of {name!r} lacks a non-negative alpha, beta or gamma"
    for k, rule in rules.items():
        if (not isinstance(rule, list) or not rule or any(
                not isinstance(r, list) or len(r) != 2 or r[1] not in select.COST
                or not (r[0] is None or isinstance(r[0], int)) for r in rule)
                or rule[-1][0] is not None):
            return f"rule {k!r} is not a list of [upper_bytes, algorithm] ending with [null, ...]"
    return None


_warned: set = set()


def load(transport: str, world_size: int, warn: bool = True) -> Calibration | None:
    """The cached calibration of this key, or None (missing, or unusable: one warning).

    Never raises for a bad file: a corrupt or mismatched one is ignored with a warning naming
    the file and how to regenerate it (once per file and process; ``warn=False``: debug only).
    """
    path = cache_path(transport, world_size)
    why: str | None
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        why = f"unreadable ({e})"
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            why = f"not valid JSON ({e})"
        else:
            why = validate(data, cache_key(transport, world_size))
            if why is None:
                model = {n: {c: float(v) for c, v in m.items()} for n, m in data["model"].items()}
                rules = {str(k): [[u, a] for u, a in r] for k, r in data["rules"].items()}
                top = data.get("measured_bytes")
                return Calibration(data["key"], model, rules, path, digest(model, rules),
                                   top if isinstance(top, int) and top > 0 else None)
    if path not in _warned:
        _warned.add(path)
        (log.warning if warn else log.debug)(
            "auto: ignoring the calibration file %s: %s; using the shipped table. To calibrate "
            "for this machine, %s.", path, why, regenerate_hint(transport, world_size))
    return None


def save(cal_data: dict, path: Path) -> Path:
    """Write a calibration dict as JSON (temp file, then rename: readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(cal_data, indent=1))
    os.replace(tmp, path)
    return path


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
