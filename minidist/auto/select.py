"""The "auto" rule: pick the all-reduce algorithm with the lowest modelled time, from DATA.

    name = choose(world_size=4, nbytes=1 << 20)            # e.g. "rd" (fitted rules, then model)
    name, why = choose_with_reason(4, 1 << 20)             # ... and the reason, for the ledger
    table(world_size=2, has_native=True, has_shm=True)     # what auto picks at every size
    load_model("benchmarks/results/allreduce_fit.json")    # refit constants from a benchmark

The model is alpha-beta-gamma: ``alpha_us`` per message (latency + Python overhead),
``beta_us_per_byte`` per byte moved, ``gamma_us_per_byte`` per byte reduced (the NumPy ufunc).
Each algorithm's cost formula and default constants come with its entry in the registry
(``minidist.comm.algorithms.ALGORITHMS``; registry.py), e.g. ring ``2(n-1) a + 2K(n-1)/n b +
K(n-1)/n g``; ``MODEL`` (a plain dict, refittable from benchmark JSON) and ``COST`` are built
from those entries ("shm_zc": "shm" on a buffer already in a shared window, same formula, its
own constants).

``CANDIDATES`` lists the algorithms "auto" may weigh (the entries with ``candidate``; "direct"
is the oracle, not a contender); which of them a call may use is each entry's ``usable``
check, made by the planner (``candidates=``), or, for this module's callers that describe a
group by two facts, ``has_native`` (the transport runs MPI) and ``has_shm`` (the ranks share
one node's memory). The shipped table, ``auto_defaults.json`` beside this module (package data:
fitted constants plus measured size rules, RULES, from ``benchmarks/allreduce.py --fit ...
--emit-defaults`` on the development machine), is loaded at the end of this module; a calibration of
the user's machine (``python -m minidist.tune``, cached per host, transport, world size and version:
calibrate.py) replaces it where one matches. Every choice comes with a reason
(``choose_with_reason``: the rule or the model's numbers), which the ledger records beside each
call. ``MINIDIST_DEBUG=1`` logs, once per size class (a power of two), the choice, its reason, and
the predicted beside the measured time (``ProcessGroup``).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any, Callable

from minidist.comm.algorithms import ALGORITHMS, on_register
from minidist.comm.algorithms import register as register_algorithm
from minidist.logger import get_logger, human_bytes

log = get_logger(__name__)

# Microseconds. alpha: per message; beta: per byte sent; gamma: per byte reduced.
MODEL: dict = {name: dict(consts) for a in ALGORITHMS.values() if a.cost is not None
               for name, consts in ((a.name, a.constants), *a.variants.items())}
COST: dict[str, Callable[..., float]] = {
    name: a.cost for a in ALGORITHMS.values() if a.cost is not None
    for name in (a.name, *a.variants)}
CANDIDATES: list = [a.name for a in ALGORITHMS.values() if a.candidate and a.cost is not None]


def register(algorithm: Any) -> None:
    """Add ``algorithm`` (a registry ``Algorithm``) to ``ALGORITHMS`` at run time, with its
    cost formula, default constants and candidacy (``_add``: a wing's entries registered
    after this module loaded join the same way). Cached choices expire (``EPOCH``)."""
    register_algorithm(algorithm)


def _add(algorithm: Any) -> None:
    """``ALGORITHMS``'s listener: a new entry's cost formula, constants and candidacy."""
    if algorithm.cost is not None:
        for name, consts in ((algorithm.name, algorithm.constants), *algorithm.variants.items()):
            COST[name] = algorithm.cost
            MODEL.setdefault(name, dict(consts))
        if algorithm.candidate and algorithm.name not in CANDIDATES:
            CANDIDATES.append(algorithm.name)
    _changed()


def _changed() -> None:
    """The model, the rules or the candidates changed: memoized choices expire (``EPOCH``,
    and each watching chooser forgets its plans)."""
    global EPOCH
    _memo.clear()
    EPOCH += 1
    for watcher in list(WATCHERS):
        watcher.rules_changed()


def usable_names(has_native: bool, has_shm: bool) -> list:
    """The ``CANDIDATES`` usable on a group described by two facts: ``has_native`` (the
    transport runs MPI's Allreduce: "mpi") and ``has_shm`` (the ranks share one node's memory:
    "shm"). The planner asks each registry entry's ``usable`` instead."""
    return [c for c in CANDIDATES if (c != "mpi" or has_native) and (c != "shm" or has_shm)]


# Size rules (MPI transport): {"<n>" or "<n>s": [[upper_bytes or None, algo], ...]}, shipped in
# auto_defaults.json from ``benchmarks/allreduce.py --fit run1.json ... --emit-defaults``: per world
# size and buffer kind ("s": the buffer lies in a shared window), the algorithm for messages
# below each threshold, fitted on the MEDIAN of repeated runs with ties (within 5 %) resolved
# toward fewer thresholds. Where the transport has MPI and a rule exists, it decides; elsewhere
# (TCP, threads, unmeasured world sizes) the alpha-beta model does.
RULES: dict = {}

_memo: dict = {}
EPOCH = 0  # bumped whenever MODEL/RULES/CANDIDATES change: callers' memoized choices expire
WATCHERS: "weakref.WeakSet[Any]" = weakref.WeakSet()  # choosers told of each change
on_register(_add)  # a wing's entries registered after this module loaded


def _from_rules(world_size: int, nbytes: int, shared: bool, allowed: list,
                rules: dict | None = None, origin: str = "measured rule"
                ) -> tuple[str | None, str]:
    """(the rule's algorithm for this message, why), or (None, "") when no rule applies."""
    key = f"{world_size}s" if shared else str(world_size)
    rule = (RULES if rules is None else rules).get(key)
    if not rule:
        return None, ""
    lower = 0
    for upper, name in rule:  # noqa: B007 - the last name is the answer
        if upper is None or nbytes < upper:
            break
        lower = upper
    if name not in allowed:
        return None, ""
    span = (f"{human_bytes(lower)} <= size < {human_bytes(upper)}" if upper and lower else
            f"size < {human_bytes(upper)}" if upper else f"size >= {human_bytes(lower)}")
    kind = "shared-window buffer" if shared else "plain buffer"
    return name, f"{origin} for n={world_size}, {kind}: {span} -> {name}"


def predict_us(name: str, world_size: int, nbytes: int, model: dict | None = None) -> float:
    """Modelled time in microseconds of one all-reduce of ``nbytes`` with algorithm ``name``
    (``model``: a calibration's constants; default the shipped ``MODEL``)."""
    if world_size <= 1:
        return 0.0
    c = (model or MODEL).get(name) or MODEL[name]
    return COST[name](world_size, float(nbytes), c["alpha_us"], c["beta_us_per_byte"],
                      c["gamma_us_per_byte"])


def choose(world_size: int, nbytes: int, has_native: bool = False, has_shm: bool = False,
           shared: bool = False, calibration: Any = None, candidates: tuple | None = None
           ) -> str:
    """The algorithm for one all-reduce: the fitted size rule, else the lowest modelled time.

    ``has_native``: the transport runs MPI's Allreduce ("mpi" may be chosen, and the measured
    RULES apply); ``has_shm``: all ranks share one node's memory ("shm" may be chosen);
    ``shared``: the buffer lies in a shared window (its own rule; without one, "shm", the
    zero-copy path). ``calibration``: a ``calibrate.Calibration`` measured on this machine,
    transport and world size (``python -m minidist.tune``): its rules and model replace the
    shipped ones. ``candidates``: the algorithms usable for this call (the planner asks the
    registry's ``usable``); default ``usable_names(has_native, has_shm)``. Memoized per
    argument tuple.
    """
    return choose_with_reason(world_size, nbytes, has_native, has_shm, shared, calibration,
                              candidates)[0]


def choose_with_reason(world_size: int, nbytes: int, has_native: bool = False,
                       has_shm: bool = False, shared: bool = False, calibration: Any = None,
                       candidates: tuple | None = None) -> tuple[str, str]:
    """``(algorithm, reason)``: what ``choose`` picks and why, in words (memoized)."""
    key = (world_size, nbytes, has_native, has_shm, shared, calibration, candidates)
    hit = _memo.get(key)
    if hit is None:
        names = (usable_names(has_native, has_shm) if candidates is None
                 else [c for c in CANDIDATES if c in candidates])
        model = None
        beyond = ""
        if calibration is not None and not calibration.covers(nbytes):
            beyond = (f" (beyond the calibrated sizes, up to "
                      f"{human_bytes(calibration.measured_bytes)}: the shipped choice)")
            calibration = None
        if calibration is not None:  # measured on this transport: its rules apply everywhere
            model = calibration.model
            name, reason = _from_rules(world_size, nbytes, shared, names, calibration.rules,
                                       f"calibrated rule ({calibration.describe()})")
        else:
            name, reason = (_from_rules(world_size, nbytes, shared, names) if has_native
                            else (None, ""))
        if name is None and shared and "shm" in names:
            name, reason = "shm", "buffer in a shared window and no measured rule -> shm"
        if name is None:
            costs = {c: predict_us(c, world_size, nbytes, model) for c in names}
            name = min(names, key=costs.__getitem__)
            reason = ("calibrated " if model else "") + (
                "cost model, lowest predicted time: " + ", ".join(
                    f"{c} {costs[c]:.0f} us" for c in sorted(names, key=costs.__getitem__)))
        if len(_memo) > 4096:
            _memo.clear()
        _memo[key] = hit = (name, reason + beyond)
    return hit


def source(calibration: Any = None) -> str:
    """Which table "auto" uses, in words: ``"calibration <file>"`` (``python -m
    minidist.tune``) or ``"shipped table (minidist/auto/auto_defaults.json)"``."""
    if calibration is not None:
        return calibration.describe()
    return (f"shipped table (minidist/auto/{DEFAULTS_FILE.name})" if SHIPPED
            else "registry's default constants (the shipped table could not be read)")


def table(world_size: int, has_native: bool, has_shm: bool, min_bytes: int = 8,
          max_bytes: int = 256 << 20, calibration: Any = None, candidates: tuple | None = None
          ) -> dict:
    """What "auto" picks for every power-of-two size, as JSON-able data (a run manifest's).

    Returns ``{"world_size", "has_native", "has_shm", "source", "candidates", "rules", "model",
    "sizes": [{"nbytes", "plain": {"algorithm", "reason", "predicted_us"}, "shared": {...} or
    None}]}``; ``shared`` (a buffer from ``ProcessGroup.alloc_buffer`` in a shared window) only
    where ``has_shm``; ``source``: see ``source``; ``candidates``: as for ``choose``.
    """
    cal_model = calibration.model if calibration is not None else None

    def pick(nbytes: int, shared: bool) -> dict:
        name, reason = choose_with_reason(world_size, nbytes, has_native, has_shm, shared,
                                          calibration, candidates)
        model = "shm_zc" if shared and name == "shm" and cal_model is None else name
        return {"algorithm": name, "reason": reason,
                "predicted_us": round(predict_us(model, world_size, nbytes, cal_model), 2)}

    all_rules = RULES if calibration is None else calibration.rules
    rules = {k: v for k, v in all_rules.items() if k.rstrip("s") == str(world_size)}
    sizes, nbytes = [], min_bytes
    while nbytes <= max_bytes:
        sizes.append({"nbytes": nbytes, "plain": pick(nbytes, False),
                      "shared": pick(nbytes, True) if has_shm else None})
        nbytes *= 2
    return {"world_size": world_size, "has_native": has_native, "has_shm": has_shm,
            "source": source(calibration),
            "candidates": (usable_names(has_native, has_shm) if candidates is None
                           else [c for c in CANDIDATES if c in candidates]),
            "rules": rules if has_native or calibration is not None else {},
            "model": {k: dict(v) for k, v in {**MODEL, **(cal_model or {})}.items()},
            "sizes": sizes}


def load_model(source: str | Path | dict) -> None:
    """Update ``MODEL`` (and ``CANDIDATES`` if given) from a dict or a JSON file.

    The JSON looks like ``{"model": {"ring": {"alpha_us": 6.0, "beta_us_per_byte": 2.5e-4,
    "gamma_us_per_byte": 2.5e-4}, ...}, "candidates": ["ring", "tree", "rd"], "rules":
    {"2": [[6144, "mpi"], [None, "ring"]], "2s": [[None, "shm"]]}}`` (every key optional).

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
    if "rules" in data:
        for key, rule in data["rules"].items():
            bad = [a for _, a in rule if a not in COST]
            if bad or not rule or rule[-1][0] is not None:
                raise ValueError(f"load_model: rule {key!r} = {rule} must list known algorithms "
                                 f"(not {bad}) and end with [None, algorithm]; known: "
                                 f"{sorted(COST)}")
        RULES.clear()
        RULES.update({str(k): [[None if u is None else int(u), str(a)] for u, a in rule]
                      for k, rule in data["rules"].items()})
    if "candidates" in data:
        unknown = [c for c in data["candidates"] if c not in COST]
        if unknown:
            raise ValueError(f"load_model: unknown candidates {unknown}; known: {sorted(COST)}")
        CANDIDATES[:] = list(data["candidates"])
    _changed()


EXPLAIN_SAMPLES = 5  # calls per size class before the median is logged


class Explainer:
    """``MINIDIST_DEBUG``: log, once per size class (a power of two, plain or shared buffer),
    what "auto" chose, why, and the predicted beside the measured time (median of the first
    ``EXPLAIN_SAMPLES`` calls; classes with fewer calls are logged by ``flush``)."""

    def __init__(self, world_size: int, calibration: Any = None) -> None:
        self.world_size = world_size
        self.calibration = calibration  # its model predicts, when "auto" uses one
        self._samples: dict = {}  # (size class, shared) -> [(name, reason, nbytes, s)] or None

    def add(self, name: str, reason: str, nbytes: int, shared: bool, seconds: float) -> None:
        """One finished auto all-reduce of ``nbytes`` that ran ``name`` and took ``seconds``."""
        key = (nbytes.bit_length(), shared)
        samples = self._samples.setdefault(key, [])
        if samples is None:
            return
        samples.append((name, reason, nbytes, seconds))
        if len(samples) >= EXPLAIN_SAMPLES:
            self._log(key)

    def flush(self) -> None:
        """Log every class not logged yet (at destroy_process_group)."""
        for key in list(self._samples):
            self._log(key)

    def _log(self, key: tuple) -> None:
        samples = self._samples.get(key)
        if not samples:
            return
        self._samples[key] = None
        name, reason, nbytes, _ = samples[-1]
        measured = sorted(s[3] for s in samples)[len(samples) // 2] * 1e6
        cal_model = self.calibration.model if self.calibration is not None else None
        model = "shm_zc" if key[1] and name == "shm" and cal_model is None else name
        log.debug("auto: %s all_reduce (%s buffer, n=%d) -> %s (%s); predicted %.1f us, "
                  "measured %.1f us (median of %d calls)", human_bytes(nbytes),
                  "shared" if key[1] else "plain", self.world_size, name, reason,
                  predict_us(model, self.world_size, nbytes, cal_model), measured,
                  len(samples))


# -- more than one node ------------------------------------------------------------------------
# Apart from the size rules and the model above (fitted on one node): when the ranks span several
# nodes (minidist.comm.topology), "hier" sends each byte across the network once per node, and
# pays two extra intra-node phases for it: below HIER_MIN_BYTES the network's latency dominates
# and recursive doubling (log2 p messages) wins. The threshold is the scale model's crossover
# (docs/scaling.md: rd below 128-512 KiB, hier above, from p = 64 to 4096 on 25-400 Gb/s links).

HIER_MIN_BYTES = 256 << 10


def choose_for_nodes(num_nodes: int, nbytes: int) -> tuple[str, str] | None:
    """``(algorithm, reason)`` when the group spans more than one node, else None (then the
    size rules and the model of one node decide): "hier" from ``HIER_MIN_BYTES`` up, "rd"
    below it."""
    if num_nodes <= 1:
        return None
    if nbytes >= HIER_MIN_BYTES:
        return "hier", (f"ranks on {num_nodes} nodes, {human_bytes(nbytes)} >= "
                        f"{human_bytes(HIER_MIN_BYTES)} -> hier (crosses the network once per "
                        "node)")
    return "rd", (f"ranks on {num_nodes} nodes, {human_bytes(nbytes)} < "
                  f"{human_bytes(HIER_MIN_BYTES)} -> rd (fewest network latencies)")


# -- the shipped table -------------------------------------------------------------------------
# Data, not code: measured on the development machine, so it suits machines like it only; the
# user's own calibration replaces it (calibrate.agreed). A missing or unreadable file leaves the
# registry's default constants and no size rules (the model alone decides), with one warning.

DEFAULTS_FILE = Path(__file__).with_name("auto_defaults.json")


def _load_shipped() -> dict:
    try:
        data = json.loads(DEFAULTS_FILE.read_text())
        load_model({k: data[k] for k in ("model", "rules") if k in data})
    except (OSError, ValueError, TypeError, AttributeError) as e:
        log.warning("auto: cannot read the shipped table %s (%s: %s); the cost model's default "
                    "constants decide. Reinstall minidist, or calibrate this machine with "
                    "`./mpirun.sh -n N python -m minidist.tune`.", DEFAULTS_FILE,
                    type(e).__name__, e)
        return {}
    return data


SHIPPED: dict = _load_shipped()  # the file's content as loaded ({} when it could not be read)
