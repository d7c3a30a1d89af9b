"""The calibration cache of "auto": one JSON file per (host, transport, world size).

    cal = load("mpi", 4)              # a Calibration, or None (a bad file: one warning)
    save(cal_data, cache_path("mpi", 4))

A file holds what ``minidist.auto.calibrate`` fitted (the cost model and the size rules), under
its key (``cache_key``: format, minidist version, host, transport, world size) and a digest the
ranks compare. ``validate`` says in one line why a file does not fit; the warning names the file
and the command that regenerates it (``regenerate_hint``). ``minidist.auto.calibrate``
re-exports all of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import zlib
from pathlib import Path
from typing import Any

from minidist.auto import select
from minidist.logger import get_logger
from minidist.user_cache import user_cache_dir
from minidist.version import __version__

log = get_logger("minidist.auto.calibrate")

FORMAT = 1
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


warned_paths: set = set()


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
    if path not in warned_paths:
        warned_paths.add(path)
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
