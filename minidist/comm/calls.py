"""One collective call: its number on its stream, its message tag, and who watches it.

    calls = Calls(transport.max_tag)                   # one per ProcessGroup
    call = calls.begin(spec, stream, shape, label)     # numbered, tagged; observers start
    ring_all_reduce(transport, flat, op, call.tag)     # every message of the call carries the tag
    calls.end(call)                          # on a CommError e: raise calls.failed(call, e)

Call numbers: every collective of a group takes the next number on its stream (``seq``, from
1), so the n-th call of one rank pairs with the n-th call of every other.

Message tags: ``begin`` folds the call's fingerprint, a hash of ``(seq, signature)``, into the
tag above the stream bits (``wire_tag``). The signature hashes what the call is (collective,
op, dtype, count, root, algorithm), so calls that differ across ranks never consume each
other's messages. The tag depends on the call alone, whoever watches.

Observers watch the calls without being part of them. An observer subclasses
``CollectiveObserver`` and overrides the events it needs, which ``begin``, ``end`` and ``failed``
call in registration order (an event it leaves alone is never called)::

    start(call)           before the call's first message; may raise a CommError (a check)
    end(call)             after the call returned
    failed(call, error)   the call raised ``error`` (before the failure diagnosis runs)

The watch wing registers the ledger, and in debug mode the consistency check and the debug
log (minidist/watch/diagnosis/). With no observer, a call costs its number, its tag and its
start and end times (``call.t0``, ``call.t1``: two clock reads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import zlib
from time import perf_counter
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from minidist.comm.errors import CommError
from minidist.comm.ops import SUPPORTED_DTYPES, ReduceOp
from minidist.comm.transports.base import MAX_STREAMS, STREAM_BITS, fingerprint_mask

# Small stable codes (the same in every process: Python's str hash is salted per process, int
# and tuple-of-int hashes are not).
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "barrier",
               "broadcast_object", "all_gather_object", "consistency_check", "alloc_buffer")
_COLLECTIVE_CODE = {name: i + 1 for i, name in enumerate(COLLECTIVES)}
_DTYPE_CODE: dict = {None: 0, **{np.dtype(d): i + 1 for i, d in enumerate(SUPPORTED_DTYPES)}}
_ALGO_CODE: dict = {None: 0}


def _algo_code(name: str | None) -> int:
    code = _ALGO_CODE.get(name)
    if code is None:
        code = _ALGO_CODE[name] = zlib.crc32(str(name).encode()) & 0xFFFFFF or 1
    return code


def signature(collective: str, op: ReduceOp | None, dtype: Any, count: int, root: int,
              algorithm: str | None) -> int:
    """The part of a call's fingerprint that does not change from call to call (no ``seq``):
    a hash of small integers, the same in every process of one Python version."""
    return hash((count, root, _COLLECTIVE_CODE[collective], 0 if op is None else op.code,
                 _DTYPE_CODE.get(dtype, 15), _algo_code(algorithm)))


def fingerprint(seq: int, collective: str, op: ReduceOp | None, dtype: Any, count: int,
                root: int, algorithm: str | None) -> int:
    """A 64-bit digest of one call, ``hash((seq, signature(...)))``: equal on every rank
    exactly when the calls agree (the n-th call of one rank only matches the n-th of another)."""
    return hash((seq, signature(collective, op, dtype, count, root, algorithm)))


@functools.lru_cache(maxsize=4096)
def label_code(label: str | None) -> int:
    """A caller's ``label=`` in the call's fingerprint: ``zlib.crc32`` (``hash`` of a str is
    salted per process), 0 for none; cached (a bucket's label repeats every step)."""
    return 0 if label is None else zlib.crc32(label.encode())


def wire_tag(stream: int, fingerprint: int, max_tag: int) -> int:
    """The message tag of one collective: ``stream`` low, ``fingerprint`` folded in above it
    (never 0), below ``max_tag`` (MPI's ``MPI_TAG_UB``: 2**29 - 1 with MPICH). The layout is
    transports/base.py's: ``stream_of`` and ``has_fingerprint`` read it back."""
    return stream | ((fingerprint & _mask_of(max_tag)) or 1) << STREAM_BITS


_mask_of = functools.lru_cache(maxsize=None)(fingerprint_mask)  # per max_tag, worked out once


class CallSpec(NamedTuple):
    """What a call is, apart from its number: the same for every repetition of one call."""

    collective: str         # "all_reduce", "broadcast", ...
    text: str               # how messages name it: 'all_reduce(algorithm="auto")'
    numel: int              # elements (0 for barrier and the *_object collectives)
    dtype: Any              # a NumPy dtype, or None
    op: ReduceOp | None
    root: int               # src of broadcast*, dst of reduce; -1: none
    algorithm: str | None   # what runs ("auto" resolved)
    reason: str | None      # why: "explicit", or auto's rule
    requested: str | None   # what the caller asked for ("auto", "ring", ...)
    signature: int          # ``signature(...)`` of the fields above
    shared: bool = False    # the buffer lies in a shared-memory window (auto chose for that)


def call_spec(collective: str, text: str, count: int = 0, dtype: Any = None,
              op: ReduceOp | None = None, root: int = -1, algorithm: str | None = None,
              reason: str | None = None, requested: str | None = None, shared: bool = False
              ) -> CallSpec:
    """A ``CallSpec`` with its signature (the planner makes all_reduce's once per shape)."""
    return CallSpec(collective, text, count, dtype, op, root, algorithm, reason,
                    algorithm if requested is None else requested,
                    signature(collective, op, dtype, count, root, algorithm), shared)


@dataclasses.dataclass(eq=False, slots=True)
class Call:
    """One collective call as its observers see it (the ledger keeps it as an entry)."""

    spec: CallSpec              # what the call is
    stream: int                 # the caller's ``tag``
    seq: int                    # its number on the stream
    tag: int                    # its message tag
    shape: Any                  # the caller's array shape (None without one)
    label: str | None           # the caller's label (``label=``), or None
    t0: float = 0.0             # ``perf_counter`` at ``begin``
    stacklevel: int = 1         # whose line is the site: 1, the collective's caller
    t1: float | None = None     # ... and at ``end`` or ``failed``; None while running
    status: Any = None          # None while running or done; a failure status once it failed
    error: str | None = None    # the first line of the error, once it failed (status is set)
    site: tuple = ()            # the caller's (code, byte offset), set by the ledger


class CollectiveObserver:
    """Base class of what watches a group's collectives: override the events you need (the
    others are never called; see the module docstring)."""

    def start(self, call: Call) -> None:
        """Before the call's first message; a CommError raised here fails the call."""

    def end(self, call: Call) -> None:
        """After the call returned."""

    def failed(self, call: Call, error: BaseException) -> None:
        """The call raised ``error``."""


def handlers(observers: tuple, event: str) -> tuple:
    """The bound ``event`` methods of the observers that override it, in order."""
    base = getattr(CollectiveObserver, event)
    return tuple(getattr(o, event) for o in observers if getattr(type(o), event) is not base)


class Calls:
    """The call numbers and observers of one process group (see the module docstring).

    Args:
        max_tag: the transport's largest message tag (the fingerprint is folded below it).
        diagnose: ``diagnose(call, error)`` -> the error to raise for a failed call (the
            process group's failure diagnosis, failure/exchange.py); None: ``error`` itself.
    """

    def __init__(self, max_tag: int,
                 diagnose: Callable[[Call, BaseException], BaseException] | None = None) -> None:
        self.max_tag = int(max_tag)
        self._mask = _mask_of(self.max_tag)  # the fingerprint bits that fit in a tag
        self.diagnose = diagnose  # the group's failure policy: the error to raise instead
        self._watch(())  # no observer yet (``observers``, and the methods each overrides)
        self._seq = [0] * MAX_STREAMS  # stream -> calls so far (a list: no hashing per call)

    def add(self, observer: CollectiveObserver) -> None:
        """Register ``observer``: it sees every call from the next one on."""
        self._watch((*self.observers, observer))

    def remove(self, observer: CollectiveObserver) -> None:
        """Stop showing calls to ``observer``."""
        self._watch(tuple(o for o in self.observers if o is not observer))

    def _watch(self, observers: tuple) -> None:
        self.observers: tuple = observers
        self._starts = handlers(observers, "start")
        self._ends = handlers(observers, "end")
        self._faileds = handlers(observers, "failed")

    def counts(self) -> dict[int, int]:
        """``{stream: calls so far}``."""
        return {stream: n for stream, n in enumerate(self._seq) if n}

    def begin(self, spec: CallSpec, stream: int, shape: Any = None,
              label: str | None = None, stacklevel: int = 1) -> Call:
        """Number, tag and time the next call on ``stream``; every observer starts watching it.

        Raises:
            CommError: an observer's check failed (as ``failed`` turns it).
        """
        seq = self._seq[stream] + 1
        self._seq[stream] = seq
        # wire_tag's formula inline (begin runs every call; tests/watch/test_ledger.py: equal)
        fp = hash((seq, spec.signature, 0 if label is None else label_code(label)))
        tag = stream | ((fp & self._mask) or 1) << STREAM_BITS
        call = Call(spec, stream, seq, tag, shape, label, perf_counter(), stacklevel)
        try:
            for start in self._starts:
                start(call)
        except CommError as e:
            raise self.failed(call, e) from e
        return call

    def end(self, call: Call) -> None:
        """The call returned: its end time; tell every observer."""
        call.t1 = perf_counter()
        for end in self._ends:
            end(call)

    def failed(self, call: Call, error: BaseException) -> BaseException:
        """The call raised ``error``: its end time; tell every observer; return the error to
        raise (what ``diagnose`` makes of it)."""
        call.t1 = perf_counter()
        for failed in self._faileds:
            failed(call, error)
        return error if self.diagnose is None else self.diagnose(call, error)

    @contextlib.contextmanager
    def unobserved(self) -> Iterator[None]:
        """Calls in the block are seen by no observer and leave the call numbers as they
        were (the auto wing's calibration); every rank must use it alike."""
        observers, counts = self.observers, list(self._seq)
        self._watch(())
        try:
            yield
        finally:
            self._watch(observers)
            self._seq[:] = counts


__all__ = ["Call", "CallSpec", "Calls", "CollectiveObserver", "call_spec", "fingerprint",
           "handlers", "signature", "wire_tag", "COLLECTIVES"]
