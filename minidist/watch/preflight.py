"""Pre-flight check: before step 0, every rank describes its run and all ranks compare.

    manifest = {**library_manifest(world_size), "parameter": [...], "bucket": [...]}
    check_manifest(manifest, "DistributedDataParallel")   # one all_gather_object; raises
                                                           # PreflightError on EVERY rank

A *run manifest* is a plain JSON-able dict: field -> value. The fields are named the way the
error reads them ("numpy version", "parameter", "batches per epoch"). Two places check one:

    DistributedDataParallel(...)   versions, world size, parameters (name, shape, dtype, in
                                   order), bucket plan, the all-reduce table "auto" uses
    Trainer.fit(...)               the same, plus dataset length, batches per epoch, the
                                   trainer settings and ``Trainer.preflight_fields`` (AMP, ...)

Each check is ONE ``all_gather_object``: every rank then holds every manifest, computes the
same diff and, if anything differs, raises the same readable error, so no rank runs into a
collective that its peers never call::

    [rank 1/3] Trainer.fit: pre-flight check failed: numpy version 2.4.6 on ranks 0, 2 but
    2.3.1 on rank 1; parameter #3 'fc.weight' (10, 6) float32 on ranks 0, 1 but 'fc.weight'
    (11, 6) float32 on rank 2. Install the same ... on every node. Every rank must build ...

How the diff reads a field: a scalar or string is compared whole; a list is compared item by
item and the first differing item is shown (``parameter #3``, or ``missing`` past the end of
a shorter list); a dict key by key (``trainer config.epochs``). Ranks are grouped by value,
rank 0's group first. A field implied by another (the bucket plan follows from the
parameters) is not reported when that other field already differs.

``MINIDIST_FAKE_VERSION`` replaces the reported minidist version: FOR TESTS ONLY (the
pre-flight test fakes a different version on one rank).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import numpy as np

from minidist import comm
from minidist.logger import rank_prefix
from minidist.version import __version__

FAKE_VERSION_VAR = "MINIDIST_FAKE_VERSION"

# What to do when a field differs (the first line of advice for each field that differs).
FIXES: dict[str, str] = {
    "minidist version": "Install the same minidist on every node (one environment for the job)",
    "numpy version": "Install the same NumPy on every node (one environment for the job)",
    "world size": "Start every rank in the same job",
    "parameter": "Every rank must build the same model (same layers, sizes and dtypes, in the "
                 "same order); look for rank-dependent code in model construction",
    "bucket": "Pass the same bucket_cap_mb and first_bucket_cap_mb on every rank",
    "all-reduce": "Every rank must use the same all-reduce algorithm and the same tuning "
                  "(the same minidist install, the same select.load_model calls)",
    "dataset length": "Pass the same full dataset on every rank: the DistributedSampler gives "
                      "each rank its shard",
    "batches per epoch": "Pass the same full dataset on every rank: the DistributedSampler "
                         "gives each rank its shard",
    "trainer config": "Pass the same TrainerConfig on every rank",
}
# field -> the field it follows from: not reported when that one already differs.
IMPLIED_BY = {"bucket": "parameter"}


class PreflightError(RuntimeError):
    """The ranks' run manifests differ; raised on every rank, before any step ran."""


def library_manifest(world_size: int) -> dict[str, Any]:
    """The fields every check starts with: library versions and the world size."""
    return {"minidist version": os.environ.get(FAKE_VERSION_VAR) or __version__,
            "numpy version": np.__version__,
            "world size": int(world_size)}


def run_manifest(world_size: int, metas: list[Any], specs: list[Any], algorithm: str,
                 group: Any) -> dict[str, Any]:
    """A DDP rank's run manifest: what every rank must agree on (library, parameters, bucket
    plan, all-reduce table). The Trainer extends it (dataset, batches per epoch, ...) for its
    own check at ``fit``."""
    return {**library_manifest(world_size),
            "parameter": [[m.name, list(m.shape), m.dtype] for m in metas],
            "bucket": [[s.dtype, list(s.param_indices), s.numel] for s in specs],
            "all-reduce": allreduce_table(algorithm, group)}


def allreduce_table(algorithm: str, group: Any) -> dict[str, Any]:
    """What decides which all-reduce algorithm runs: the names asked for and the "auto" table.

    ``auto`` picks per message size from fitted size rules, else an alpha-beta model
    (``minidist.comm.auto_table`` lists its choice, reason and predicted time per size): if two
    ranks hold different tables they may pick different algorithms for the same all-reduce,
    which hangs or mixes bytes.
    """
    return {"algorithm": algorithm, "group default": group.algorithm,
            "auto": comm.auto_table(group)}


def check_manifest(manifest: dict[str, Any], operation: str, group: Any = None) -> None:
    """Gather every rank's manifest (one ``all_gather_object``) and raise if any field differs.

    COLLECTIVE: every rank of ``group`` must call it, at the same point.

    Args:
        manifest: this rank's fields (JSON-able values; tuples come back as lists).
        operation: what is being checked, for the message ("DistributedDataParallel").
        group: the process group (default: the world).

    Raises:
        PreflightError: on every rank, naming each differing field, the ranks and the fix.
    """
    everyone = comm.all_gather_object(manifest, group=group)
    problems = manifest_diff(everyone)
    if not problems:
        return
    fixes = list(dict.fromkeys(FIXES.get(f, f"Every rank must pass the same {f}")
                               for f, _ in problems))
    raise PreflightError(f"{rank_prefix()} {operation}: pre-flight check failed: "
                         f"{'; '.join(text for _, text in problems)}. {'. '.join(fixes)}.")


def manifest_diff(manifests: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``[(field, "what differs, on which ranks"), ...]`` over the ranks' manifests; [] if none.

    >>> manifest_diff([{"numpy version": "2.4.6"}, {"numpy version": "2.3.1"}])
    [('numpy version', 'numpy version 2.4.6 on rank 0 but 2.3.1 on rank 1')]
    """
    fields = list(dict.fromkeys(k for m in manifests for k in m))
    out: list[tuple[str, str]] = []
    differs: set[str] = set()
    for field in fields:
        text = _first_difference(field, [m.get(field, _MISSING) for m in manifests],
                                 _FORMATS.get(field))
        if text is not None:
            differs.add(field)
            if IMPLIED_BY.get(field) not in differs:
                out.append((field, text))
    return out


_MISSING = object()


def _key(value: Any) -> str:
    return "<missing>" if value is _MISSING else json.dumps(value, sort_keys=True)


def _first_difference(label: str, values: list, fmt: Callable[[Any], str] | None,
                      top: bool = True) -> str | None:
    """Where the ranks' ``values`` first differ, as text; None if they are all equal.

    A field that is a list is compared item by item (its items are shown whole, with
    ``fmt``); a dict key by key, at any depth.
    """
    if len({_key(v) for v in values}) == 1:
        return None
    if top and all(isinstance(v, list) for v in values):
        for i in range(max(len(v) for v in values)):
            text = _first_difference(f"{label} #{i}", [v[i] if i < len(v) else _MISSING
                                                       for v in values], fmt, top=False)
            if text is not None:
                return text
    if all(isinstance(v, dict) for v in values):
        for k in dict.fromkeys(k for v in values for k in v):
            text = _first_difference(f"{label}.{k}", [v.get(k, _MISSING) for v in values],
                                     None, top=False)
            if text is not None:
                return text
    groups: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(_key(v), []).append(r)
    shown = [f"{_show(values[ranks[0]], fmt)} on {_ranks(ranks)}" for ranks in groups.values()]
    return f"{label} {shown[0]} but {', '.join(shown[1:])}"


def _show(value: Any, fmt: Callable[[Any], str] | None) -> str:
    if value is _MISSING:
        return "missing"
    if fmt is not None:
        return fmt(value)
    return value if isinstance(value, str) else json.dumps(value)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _param(p: Any) -> str:
    name, shape, dtype = p
    return f"{name!r} {tuple(shape)} {dtype}"


def _bucket(b: Any) -> str:
    dtype, indices, numel = b
    return f"{numel} x {dtype} (parameters {', '.join(f'#{i}' for i in indices)})"


_FORMATS: dict[str, Callable[[Any], str]] = {"parameter": _param, "bucket": _bucket}
