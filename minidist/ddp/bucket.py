"""Gradient buckets: which parameters share one flat all-reduce buffer, and the buffer itself.

DDP does not all-reduce parameter by parameter (a message per tensor costs a latency each) nor
the whole model at once (nothing could overlap with backward). It groups gradients into
*buckets* of a few MiB, in REVERSE parameter order, because backward produces the gradients of
the last layer first::

    parameters (registration order)   fc1.weight fc1.bias fc2.weight fc2.bias fc3.weight fc3.bias
    backward produces them            <------------------------------------------------- first
    buckets (reverse order)           [ bucket 2 ........ ][ bucket 1 ........ ][ bucket 0  ]
                                                                                small (1 MiB):
                                                                                ready soonest

    bucket.buffer   |fc3.bias.grad|..|fc3.weight.grad ........|  one flat array, filled in
                                  ^ zeros up to the next         reverse order too
                                    64-byte boundary
    p.grad          = bucket.buffer[offset:offset + numel].reshape(p.shape)   (a view, no copy)

Every gradient starts on a cache line (``SLOT_ALIGN_BYTES``): the matrix product that writes
a weight's gradient runs 6-8 % slower into a view that starts mid-line
(benchmarks/bucket_alignment.py). The few elements of padding stay zero (the sum of zeros
over the ranks is zero), and nothing reads them as a gradient.

The first bucket is small (1 MiB) so the first all-reduce starts as early as possible; the
others are capped at ``bucket_cap_mb`` (25 MiB): the same constants and the same greedy rule as
torch's ``compute_bucket_assignment_by_size`` (reducer.cpp). A bucket never mixes dtypes (one
buffer has one dtype), so each dtype fills its own open bucket.

    plan = plan_buckets(params_meta, bucket_cap_bytes=25 << 20, first_bucket_cap_bytes=1 << 20)
    plan[0].param_indices      # indices into the parameter list, in the order backward fills them

Lifecycle of a bucket in one step (an explicit state, not three booleans)::

    EMPTY --first grad written--> FILLING --last grad written--> READY
          --handed to the comm thread--> REDUCING --all-reduce done--> REDUCED --next step--> EMPTY
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from minidist import xp as backend

# 1 MiB first bucket, 25 MiB cap, as torch reducer.hpp (kDefaultFirstBucketBytes,
# kDefaultBucketBytesCap).
DEFAULT_FIRST_BUCKET_BYTES = 1 << 20
DEFAULT_BUCKET_CAP_BYTES = 25 << 20


class BucketState(enum.Enum):
    """Where a bucket is in the current step (see the module docstring)."""

    EMPTY = "empty"
    FILLING = "filling"
    READY = "ready"
    REDUCING = "reducing"
    REDUCED = "reduced"


@dataclass(frozen=True)
class ParamMeta:
    """What the bucket planner needs to know about one parameter."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


SLOT_ALIGN_BYTES = 64  # each gradient's slot in a bucket starts on a cache line


def slot_offset(numel: int, itemsize: int) -> int:
    """The first element at or after ``numel`` that starts a ``SLOT_ALIGN_BYTES`` boundary
    (of a buffer that itself starts on one)."""
    per_line = max(1, SLOT_ALIGN_BYTES // itemsize)
    return -(-numel // per_line) * per_line


@dataclass
class BucketSpec:
    """One bucket of the plan: the parameters it holds and where each one sits in the buffer."""

    index: int
    dtype: str
    param_indices: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    numel: int = 0

    def signature(self) -> tuple:
        """A compact, comparable description (checked identical on every rank)."""
        return (self.dtype, tuple(self.param_indices), self.numel)


def plan_buckets(params: Sequence[ParamMeta],
                 bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
                 first_bucket_cap_bytes: int = DEFAULT_FIRST_BUCKET_BYTES) -> list[BucketSpec]:
    """Assign parameters to buckets: reverse order, one open bucket per dtype, greedy by size.

    Walk the parameters from last to first. Each dtype has one open bucket; a parameter joins
    the open bucket of its dtype, and when that bucket reaches its size limit it is closed. The
    limit is ``first_bucket_cap_bytes`` for the first bucket of each dtype and
    ``bucket_cap_bytes`` after that. A parameter is never split, so one parameter bigger than
    the cap gets a bucket of its own. Buckets are numbered in the order they are opened, which
    is the order backward completes them (roughly) and the order they are all-reduced on every
    rank.

    Args:
        params: metadata of every parameter that needs a gradient, in registration order.
        bucket_cap_bytes: size limit of every bucket after the first (torch: 25 MiB).
        first_bucket_cap_bytes: size limit of the first bucket (torch: 1 MiB).

    Returns:
        The buckets, in reduction order; every parameter index appears in exactly one bucket.

    Raises:
        ValueError: a cap is not positive.
    """
    if bucket_cap_bytes <= 0 or first_bucket_cap_bytes <= 0:
        raise ValueError(f"plan_buckets: bucket caps must be positive, got bucket_cap_bytes="
                         f"{bucket_cap_bytes}, first_bucket_cap_bytes={first_bucket_cap_bytes}. "
                         "Pass bucket_cap_mb > 0 and first_bucket_cap_mb > 0.")
    open_by_dtype: dict[str, BucketSpec] = {}
    closed_count: dict[str, int] = {}
    opened: list[BucketSpec] = []
    for i in reversed(range(len(params))):
        meta = params[i]
        bucket = open_by_dtype.get(meta.dtype)
        if bucket is None:
            bucket = BucketSpec(index=len(opened), dtype=meta.dtype)
            open_by_dtype[meta.dtype] = bucket
            opened.append(bucket)
        itemsize = np.dtype(meta.dtype).itemsize
        bucket.param_indices.append(i)
        bucket.offsets.append(slot_offset(bucket.numel, itemsize))  # on a cache line
        bucket.numel = bucket.offsets[-1] + meta.numel
        limit = first_bucket_cap_bytes if closed_count.get(meta.dtype, 0) == 0 else bucket_cap_bytes
        if bucket.numel * itemsize >= limit:
            del open_by_dtype[meta.dtype]
            closed_count[meta.dtype] = closed_count.get(meta.dtype, 0) + 1
    return opened


class Bucket:
    """One bucket: its flat buffer, its parameters' gradient views, and how it is reduced.

    ``buffer`` is one contiguous 1-D array (allocated by the process group, so a transport may
    place it in shared memory); ``views[k]`` is the gradient view of parameter
    ``spec.param_indices[k]``. ``pending`` counts the gradients still missing this step.

    It is also what a comm hook receives (torch's ``GradBucket``; hooks.py).

    Args:
        spec: the bucket's plan (``plan_buckets``).
        params: every parameter (the spec's indices point into it).
        names: their names, for messages.
        buffer: the flat buffer (``alloc_bucket_buffer``).
        group: the process group it is reduced over (``all_reduce``); None for a bucket that
            is never reduced (tests of the bookkeeping).
        algorithm: the all-reduce algorithm passed to the group ("auto": its choice).
        is_last: the last bucket of a step (a hook may finish per-step work there).
    """

    def __init__(self, spec: BucketSpec, params: Sequence[Any], names: Sequence[str],
                 buffer: Any, group: Any = None, algorithm: str = "auto",
                 is_last: bool = False) -> None:
        if buffer.ndim != 1 or buffer.size != spec.numel:
            raise ValueError(f"Bucket {spec.index}: buffer has shape {buffer.shape}, expected "
                             f"({spec.numel},). Allocate numel={spec.numel} elements.")
        self.spec = spec
        self.index = spec.index
        self.buffer = buffer
        self.params = [params[i] for i in spec.param_indices]
        self.names = [names[i] for i in spec.param_indices]
        self.views = [buffer[off:off + p.array.size].reshape(p.array.shape)
                      for off, p in zip(spec.offsets, self.params)]
        for off, p, nxt in zip(spec.offsets, self.params, [*spec.offsets[1:], spec.numel]):
            buffer[off + p.array.size:nxt] = 0  # the padding before the next cache line
        self.group = group
        self.algorithm = algorithm
        self.world_size = group.size if group is not None else 1
        # what the average divides by: the world size, or under DistributedDataParallel.join()
        # the number of ranks that trained this step (the Reducer sets it per step)
        self.divisor = self.world_size
        self.is_last = is_last
        self.name = f"bucket={spec.index}"  # in the ledger of every collective it runs: its
        self.label = self.name  # label, which an observer may extend per step (the batch)
        self.on_device = backend.is_device_array(buffer)  # GPU: sync the stream before sending
        self.state = BucketState.EMPTY
        self.pending = len(self.params)
        self._done = [False] * len(self.params)  # which grads reported this step
        # after the reduction: True/False once known (a GradScaler's unscale or the NaN/inf
        # check, both DDP observers), None before
        self.finite: bool | None = None

    def all_reduce(self, array: Any, op: str = "sum") -> None:
        """All-reduce ``array`` (this bucket's buffer, or a hook's own contiguous array) in
        place over the DDP's process group, with its algorithm."""
        self.group.all_reduce(array, op, self.algorithm, label=self.label)

    def __repr__(self) -> str:
        return (f"Bucket(index={self.index}, dtype={self.spec.dtype}, numel={self.spec.numel}, "
                f"params={self.names}, state={self.state.name})")

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    def reset(self) -> None:
        """Start a new step: every gradient is missing again."""
        self.state = BucketState.EMPTY
        self.pending = len(self.params)
        self._done = [False] * len(self.params)
        self.finite = None

    def attach_grads(self, zero_missing: bool = True) -> int:
        """Make every parameter's ``.grad`` the bucket view again; return how many were re-attached.

        A grad that is ``None`` (``optimizer.zero_grad()`` with ``set_to_none=True``) becomes a
        zeroed view, unless ``zero_missing=False``: then it stays None and backward writes it
        straight into the view, the parameter's reserved gradient destination (no memset here,
        no accumulate-into-zeros there, no copy). A grad that is some other array (the user
        assigned one) is copied into the view first, so its value is kept. A grad that already
        is the view is left alone, so accumulation under ``no_sync`` is never broken.
        """
        fixed = 0
        for p, view in zip(self.params, self.views):
            g = None if p.grad is None else p.grad.array
            if g is view:
                continue
            if g is None:
                if not zero_missing:
                    continue
                view[...] = 0
            else:
                view[...] = g
            p.grad = view
            fixed += 1
        return fixed

    def missing_names(self) -> list[str]:
        """Names of parameters whose gradient has not been reported this step (for errors)."""
        return [n for n, done in zip(self.names, self._done) if not done]

    def mark_slot_done(self, k: int) -> bool:
        """Record that gradient ``k`` of this bucket is complete; True if it was the last one
        (the bucket is then READY; a second report of the same slot changes nothing)."""
        if self._done[k]:
            return False
        self._done[k] = True
        self.pending -= 1
        self.state = BucketState.READY if self.pending == 0 else BucketState.FILLING
        return self.pending == 0


def alloc_bucket_buffer(group: Any, numel: int, dtype: Any, xp: Any) -> Any:
    """A bucket's flat buffer from the process group (a transport may place it in shared
    memory), or a plain ``xp`` array when the group's buffer lives elsewhere (device
    parameters, host-only transport)."""
    buf = group.alloc_buffer(numel, dtype, xp)
    if backend.get_array_module(buf) is not xp:
        buf = xp.empty(numel, dtype=dtype)
    return buf
