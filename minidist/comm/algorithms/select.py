"""The "auto" rule: pick the all-reduce algorithm with the lowest modelled time, from DATA.

    name = choose(world_size=4, nbytes=1 << 20)            # -> "ring"
    load_model("benchmarks/results/allreduce_fit.json")    # refit constants from a benchmark

The model is alpha-beta-gamma: ``alpha_us`` per message (latency + Python overhead),
``beta_us_per_byte`` per byte moved, ``gamma_us_per_byte`` per byte reduced (the NumPy ufunc). Each algorithm has its
own constants in ``MODEL`` (a plain dict, refittable from benchmark JSON) and a cost formula in
``COST`` (K = message bytes, n = world size, L = ceil(log2 n), p = 2^floor(log2 n)):

  ring    2(n-1) a + 2K(n-1)/n b + K(n-1)/n g
  tree    2L (a + K b) + L K g
  rd      doubling: log2(p)(a + K b + K g); Rabenseifner: 2 log2(p) a + 2K(p-1)/p b + K(p-1)/p g;
          plus a fold 2a + 2K b + K g when n is not a power of two
  direct  2(n-1)(a + K b) + (n-1) K g
  mpi     2L a + 2K(n-1)/n b + K(n-1)/n g   (only where the transport has MPI)

``CANDIDATES`` lists the algorithms "auto" may choose from (``direct`` is the oracle, not a
contender). The default constants are rough numbers for this 2-core VM (MPI transport, n=2);
E's benchmark refits them. ``MINIDIST_DEBUG=1`` logs every choice.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from minidist.comm.algorithms.recursive_doubling import uses_halving

# Microseconds. alpha: per message; beta: per byte sent; gamma: per byte reduced.
MODEL: dict = {
    "ring": {"alpha_us": 6.0, "beta_us_per_byte": 2.5e-4, "gamma_us_per_byte": 2.5e-4},
    "tree": {"alpha_us": 5.0, "beta_us_per_byte": 2.5e-4, "gamma_us_per_byte": 2.5e-4},
    "rd": {"alpha_us": 5.0, "beta_us_per_byte": 2.5e-4, "gamma_us_per_byte": 2.5e-4},
    "direct": {"alpha_us": 5.0, "beta_us_per_byte": 2.5e-4, "gamma_us_per_byte": 2.5e-4},
    "mpi": {"alpha_us": 3.0, "beta_us_per_byte": 3.0e-4, "gamma_us_per_byte": 2.5e-4},
}
CANDIDATES: list = ["ring", "tree", "rd"]


def _ring(n: int, k: float, a: float, b: float, g: float) -> float:
    return 2 * (n - 1) * a + 2 * k * (n - 1) / n * b + k * (n - 1) / n * g


def _tree(n: int, k: float, a: float, b: float, g: float) -> float:
    lg = math.ceil(math.log2(n))
    return 2 * lg * (a + k * b) + lg * k * g


def _rd(n: int, k: float, a: float, b: float, g: float) -> float:
    p = 1 << (n.bit_length() - 1)
    lg = math.log2(p)
    fold = 0.0 if p == n else 2 * a + 2 * k * b + k * g
    if uses_halving(int(k), int(k), n):  # numel >= p holds for any K worth halving
        return fold + 2 * lg * a + 2 * k * (p - 1) / p * b + k * (p - 1) / p * g
    return fold + lg * (a + k * b + k * g)


def _direct(n: int, k: float, a: float, b: float, g: float) -> float:
    return 2 * (n - 1) * (a + k * b) + (n - 1) * k * g


def _mpi(n: int, k: float, a: float, b: float, g: float) -> float:
    return 2 * math.ceil(math.log2(n)) * a + 2 * k * (n - 1) / n * b + k * (n - 1) / n * g


COST: dict[str, Callable[..., float]] = {
    "ring": _ring, "tree": _tree, "rd": _rd, "direct": _direct, "mpi": _mpi,
}

_memo: dict = {}


def predict_us(name: str, world_size: int, nbytes: int) -> float:
    """Modelled time in microseconds of one all-reduce of ``nbytes`` with algorithm ``name``."""
    if world_size <= 1:
        return 0.0
    c = MODEL[name]
    return COST[name](world_size, float(nbytes), c["alpha_us"], c["beta_us_per_byte"],
                      c["gamma_us_per_byte"])


def choose(world_size: int, nbytes: int, has_native: bool = False) -> str:
    """The candidate with the lowest modelled time (memoized per (world_size, nbytes))."""
    key = (world_size, nbytes, has_native)
    name = _memo.get(key)
    if name is None:
        names = [c for c in CANDIDATES if c != "mpi" or has_native]
        name = min(names, key=lambda c: predict_us(c, world_size, nbytes))
        if len(_memo) > 4096:
            _memo.clear()
        _memo[key] = name
    return name


def load_model(source: str | Path | dict) -> None:
    """Update ``MODEL`` (and ``CANDIDATES`` if given) from a dict or a JSON file.

    The JSON looks like ``{"model": {"ring": {"alpha_us": 6.0, "beta_us_per_byte": 2.5e-4,
    "gamma_us_per_byte": 2.5e-4}, ...}, "candidates": ["ring", "tree", "rd"]}``.

    Raises:
        ValueError: for an algorithm without a cost formula or a missing constant.
    """
    data = source if isinstance(source, dict) else json.loads(Path(source).read_text())
    for name, consts in data.get("model", {}).items():
        if name not in COST:
            raise ValueError(f"load_model: no cost formula for algorithm {name!r}; known: "
                             f"{sorted(COST)}")
        missing = {"alpha_us", "beta_us_per_byte", "gamma_us_per_byte"} - set(consts)
        if missing:
            raise ValueError(f"load_model: {name!r} lacks {sorted(missing)}")
        MODEL[name] = {k: float(consts[k]) for k in ("alpha_us", "beta_us_per_byte",
                                                     "gamma_us_per_byte")}
    if "candidates" in data:
        unknown = [c for c in data["candidates"] if c not in COST]
        if unknown:
            raise ValueError(f"load_model: unknown candidates {unknown}; known: {sorted(COST)}")
        CANDIDATES[:] = list(data["candidates"])
    _memo.clear()
