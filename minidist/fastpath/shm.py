"""Shared-memory all-reduce (algorithm "shm"): ranks on one node add straight from each other.

    shm_all_reduce(mpi_transport, buf, ReduceOp.SUM)       # any 1-D contiguous NumPy array
    buf = shm_alloc_buffer(mpi_transport, numel, np.float32)   # optional: a shared bucket,
    shm_all_reduce(mpi_transport, buf, ReduceOp.SUM)           # then even the copy-in is skipped

No messages at all: every rank maps every peer's slot of an MPI-3 shared window (see
transports/shm_window.py) and rank r owns slice r of the reduction. N=3::

    slots:    rank 0 [ a0 | a1 | a2 ]      (1) copy my buffer into my slot (all but my own
              rank 1 [ b0 | b1 | b2 ]          slice: only I read that one), write my header
              rank 2 [ c0 | c1 | c2 ]      (2) barrier; compare headers
                        |    |    |        (3) rank r, element by element: slice r =
              rank 1 reads a1, b1, c1          a_r + b_r + c_r (rank order), written to its
              and writes the sum back over     own buffer and PUSHED over a_r, c_r in the
              a1, b1 and c1 in one pass        peers' slots in the same pass
                                           (4) barrier
                                           (5) every finished slice now sits in MY slot: copy
                                               it out (two contiguous copies, local memory)

The scratch window is allocated once, grown when a larger message comes (collectively: every
rank sees the same header), and double-buffered: successive calls (and chunks of messages over
``CHUNK_BYTES``) alternate halves, so step (1) of the next call may start before peers finish
step (5) of this one: 2 barriers per call. Three special cases:

- small messages (<= ``SMALL_BYTES``, 32 KiB): no header, no barrier, no scratch window; each
  rank copies its message into its mailbox and reduces the WHOLE buffer from every mailbox
  once all have posted (fastpath/shm_mailbox.py: latency-bound sizes pay per step, not byte);
- ``buf`` lies in a shared window (``shm_alloc_buffer``) at the same offset on every rank: steps
  (1) and (5) disappear, (3) reads and pushes into the peers' buffers themselves, and a final
  barrier says every peer's slice has landed in mine - the zero-copy path;
- ranks disagree on numel/dtype/op, or on the call's fingerprint (``tag``: another collective,
  another call number): CollectiveMismatch on every rank (all read the same headers).

Memory traffic per rank, zero-copy: read K, write K (reduce + push fused in one loop, a Numba
kernel for float sums: kernels/reduce_cpu.py; AVG divides there too, and the NaN/inf check
rides along; NumPy does the same per cache-sized piece, ``reduce_pieces``); the copy path adds
a copy-in and a copy-out of K(N-1)/N each (timings against MPI: the tables of
docs/benchmarks.md). Invariant: each slice is reduced once, in rank order (x0 + x1 + ... like
``direct``), so every rank ends with identical bits. Only for the MPI transport with all
ranks on one node - a real one, not split into virtual nodes by ``MINIDIST_RANKS_PER_NODE``
(CommError otherwise; ``shm_available`` tells "auto").

Concurrency: all state (flag barrier, headers, scratch window) belongs to one transport, so
collectives on two groups (two transports, e.g. DDP's comm thread on the default group and a
user's all-reduce on ``new_group``) never share a window or a barrier. Within one group, only
stream 0 (``tag=0``) may use it: two threads on two streams of one group would interleave
their barriers and headers, and windows are grown by MPI collectives that two threads must not
race. ``auto`` on another stream picks a message-passing algorithm; ``algorithm="shm"`` with
``tag != 0`` is a ValueError.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from minidist.comm.algorithms.registry import Algorithm, model
from minidist.comm.ops import ReduceOp, combine, finalize
from minidist.comm.topology import detect_topology
from minidist.comm.transports.base import Transport, stream_of
from minidist.envvars import env
from minidist.fastpath.shm_checks import (DTYPE_CODES, raise_mismatch, shm_available,
                                          shm_is_shared, shm_usable)
from minidist.fastpath.shm_mailbox import mailbox_all_reduce
from minidist.fastpath.shm_window import (SMALL_BYTES, SharedWindow, ShmNode, shm_alloc_buffer,
                                          shm_close, shm_node, window_of)
from minidist.kernels.fallback import CompiledBackend

CHUNK_BYTES = int(env("MINIDIST_SHM_CHUNK_BYTES"))  # default 64 MiB
PIECE_BYTES = int(env("MINIDIST_SHM_PIECE_BYTES"))  # default 1 MiB -> reduce_pieces

# Step (3)'s one-pass sum, loaded and rehearsed by minidist.kernels.fallback: if it cannot
# compile here, one warning, then ``sum_pieces`` (NumPy, piece by piece: the same bits).
_KERNEL = CompiledBackend("numba-cpu", "minidist.kernels.reduce_cpu",
                          "Install a numba that supports this NumPy (`pip install -U numba`) "
                          "for the one-pass reduction of the shared-memory all-reduce.")
KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@functools.lru_cache(maxsize=256)  # the same few sizes every step (DDP's buckets)
def line_aligned_bounds(numel: int, n: int, itemsize: int) -> tuple[int, ...]:
    """Slice starts per rank (+ end), cut at 64-byte multiples so writers don't share lines."""
    align = max(1, 64 // itemsize)  # elements per cache line
    per = -(-numel // (n * align)) * align  # ceil(numel / n), rounded up to whole lines
    return (*[min(j * per, numel) for j in range(n)], numel)


def _check_headers(node: ShmNode) -> tuple[bool, bool]:
    """Compare every rank's header (raise on mismatch, on every rank alike).

    Returns:
        (all buffers are shared at the same place, every rank did step (1) of chunk 0 early).
    """
    h = [hd[node.calls & 1, :7].tolist() for hd in node.headers]  # Python ints: cheap compares
    mine = h[node.rank]
    if any(x[:3] != mine[:3] or x[6] != mine[6] for x in h):  # numel, dtype, op; fingerprint
        raise_mismatch(node, h)
    return all(x[3] >= 0 and x[3:5] == mine[3:5] for x in h), all(x[5] for x in h)


class _Scratch:
    """The double-buffered scratch window: two halves of ``half_bytes`` per rank."""

    def __init__(self, node: ShmNode, half_bytes: int) -> None:
        self.half_bytes = half_bytes
        self.win = SharedWindow(node.comm, 2 * half_bytes, node.arrive)

    def free(self) -> None:
        self.win.free()

    def slots(self, half: int, dtype: np.dtype, numel: int) -> list[np.ndarray]:
        lo = half * self.half_bytes
        return [s[lo: lo + numel * dtype.itemsize].view(dtype) for s in self.win.slots]


def scratch_window(node: ShmNode, nbytes: int) -> _Scratch:
    """The scratch window, grown (collectively: every rank asks for the same size) if needed."""
    sc = node.extra.get("scratch")
    if sc is None or sc.half_bytes < nbytes:
        if sc is not None:
            sc.win.free()
        half = min(max(64 << 10, 1 << max(nbytes - 1, 1).bit_length()), max(CHUNK_BYTES, 64))
        sc = node.extra["scratch"] = _Scratch(node, max(half, nbytes))
    return sc


def _copy_in(slot: np.ndarray, part: np.ndarray, lo: int, hi: int) -> None:
    """Step (1): peers read every slice of mine except my own slice [lo, hi) (only I read it)."""
    slot[:lo] = part[:lo]
    slot[hi:] = part[hi:]


def _reduce_push(node: ShmNode, bufs: list, op: ReduceOp) -> bool:
    """Step (3): every rank's copy of my slice (``bufs[j]``: rank j's; mine is ``bufs[me]``)
    becomes the reduction of all of them, in rank order; returns False if the result may hold
    NaN/inf (True: it holds none).

    A sum or average of float32/float64 runs the one-pass kernel of kernels/reduce_cpu.py
    (each buffer read once and written once, the divide and the NaN/inf check in the same
    loop); other ops and dtypes, or a machine where it cannot compile, run ``reduce_pieces``,
    which computes the same bits.
    """
    t = tuple(bufs)
    if op.ufunc is not np.add or t[0].dtype not in KERNEL_DTYPES:
        return reduce_pieces(t, op, node.size)
    divisor = node.size if op.averages else 1
    chosen = node.extra.setdefault("sum_to_all", {})  # per dtype: the kernel or its reference
    kernel = chosen.get(t[0].dtype)
    if kernel is None:
        kernel = chosen[t[0].dtype] = _KERNEL.bind("sum_to_all", sum_pieces, t, divisor)
    return bool(kernel(t, divisor))


def reduce_pieces(bufs: tuple, op: ReduceOp, n: int) -> bool:
    """Step (3) in NumPy, for any op and dtype: reduce a piece (``PIECE_BYTES``, well under the
    L2 cache) of every buffer into a temporary, finish it (AVG divides by ``n``), check it
    (``finite_fast``) and write it back to every buffer while it and the lines just read are
    still in cache. Returns False if the result may hold NaN/inf."""
    size, dtype = bufs[0].size, bufs[0].dtype
    step = max(PIECE_BYTES // dtype.itemsize // 64 * 64, 64)  # elements: whole cache lines
    tmp = np.empty(min(step, size), dtype)
    finite = True
    for p0 in range(0, size, step):
        t = tmp[:min(step, size - p0)]
        op.ufunc(bufs[0][p0:p0 + step], bufs[1][p0:p0 + step], out=t)
        for b in bufs[2:]:
            combine(t, b[p0:p0 + step], op)
        finalize(t, op, n)
        finite = finite and finite_fast(t)
        for b in bufs:
            b[p0:p0 + step] = t
    return finite


def sum_pieces(bufs: tuple, divisor: int) -> bool:
    """The reference of the kernel ``sum_to_all``: ``reduce_pieces`` of a sum (``divisor``
    1) or an average over ``divisor`` ranks."""
    return reduce_pieces(bufs, ReduceOp.SUM if divisor == 1 else ReduceOp.AVG, divisor)


def finite_fast(piece: np.ndarray) -> bool:
    """True if ``piece`` holds no NaN/inf; False means "maybe" (search it exactly then).

    One dot product ``piece . piece``: a NaN or inf makes it NaN/inf and squares never cancel;
    finite values above ~1e19 (float32) overflow it into a false "maybe". Integers: True.
    ``np.vdot``, not ``dot``: the same BLAS call, but it raises no overflow warning.
    """
    return bool(np.isfinite(np.vdot(piece, piece)))


def _copy_path(node: ShmNode, flat: np.ndarray, op: ReduceOp, first_done: bool) -> None:
    """Stream ``flat`` through the double-buffered scratch window, one chunk at a time.

    Per chunk: (1) copy-in of the slices peers reduce, barrier, (3) reduce my slice from the
    peers' slots and push the result back into those same places (the peers' slots), barrier,
    (5) copy the finished slices out of MY slot: two contiguous copies, local memory.
    """
    n, me = node.size, node.rank
    node.extra.pop("verdict", None)  # the in-place path's last verdict is no longer the latest
    step = max(CHUNK_BYTES // flat.itemsize, 1)
    for c0 in range(0, flat.size, step):
        part = flat[c0:c0 + step]
        b = line_aligned_bounds(part.size, n, flat.itemsize)
        lo, hi = b[me], b[me + 1]
        sc = scratch_window(node, part.nbytes)  # grows at c0 == 0 only: later chunks are smaller
        slots = sc.slots(node.half, flat.dtype, part.size)
        if c0 > 0 or not first_done:
            _copy_in(slots[me], part, lo, hi)  # (1)
            node.barrier("all_reduce(shm) copy-in")  # (2)
        if hi > lo:  # (3)
            peers = [s[lo:hi] for s in slots]
            peers[me] = part[lo:hi]
            _reduce_push(node, peers, op)
        node.barrier("all_reduce(shm) reduce")  # (4)
        _copy_in(part, slots[me], lo, hi)  # (5) everyone else's finished slice, from my slot
        node.half ^= 1


def _in_place_path(node: ShmNode, flat: np.ndarray, op: ReduceOp, where: tuple) -> None:
    """All buffers are shared at the same offset: reduce my slice from them and push it into
    every buffer (no copy-in, no copy-out), then wait until peers pushed theirs into mine.

    These are DDP's buckets, so the reduction also checks its slice for NaN/inf while it is in
    cache and writes the verdict into its header (word 7) before the barrier; after it, every
    rank reads all verdicts into ``node.extra["verdict"]``: ``(flat, all finite)``, which DDP's
    NaN/inf check (watch wing) takes through ``group.shared_memory.reduced_finite`` instead of
    a pass of its own over the bucket.
    """
    b = line_aligned_bounds(flat.size, node.size, flat.itemsize)
    lo, hi = b[node.rank], b[node.rank + 1]  # (an empty slice, hi == lo: nothing to do)
    start, end = where[1] + lo * flat.itemsize, where[1] + hi * flat.itemsize  # bytes
    bufs = [s[start:end].view(flat.dtype) for s in node.user_windows[where[0]].slots]
    bufs[node.rank] = flat[lo:hi]
    finite = _reduce_push(node, bufs, op)
    node.headers[node.rank][node.calls & 1, 7] = finite
    node.barrier("all_reduce(shm) push")  # every peer's slice landed in ``flat``
    node.extra["verdict"] = (flat, all(h[node.calls & 1, 7] for h in node.headers))


def reduced_finite(node: ShmNode, buf: Any) -> bool | None:
    """The NaN/inf verdict of the last in-place reduction on ``node``, if it reduced ``buf``:
    True, or False for "maybe" (search it exactly); None otherwise (check it yourself).
    Handed out once. Ask right after the reduction, as DDP's check does after each bucket's
    comm hook: the verdict does not know of reductions of ``buf`` by other algorithms since."""
    verdict = node.extra.pop("verdict", None)  # (the array, its verdict): _in_place_path's
    return verdict[1] if verdict is not None and verdict[0] is buf else None


def shm_all_reduce(transport: Transport, buf: Any, op: ReduceOp, tag: int = 0) -> None:
    """All-reduce ``buf`` (1-D contiguous NumPy) in place through shared memory.

    Checks that "shm" can run here, then runs ``node_all_reduce`` on the transport's node (a
    process group's plan runs that directly: the checks were ``shm_usable`` at plan time).

    Args:
        transport: the MPI transport (all ranks on one node).
        buf: the array to reduce; identical shape and dtype on every rank.
        op: the reduction.
        tag: the call's message tag from the process group; compared across ranks in the
            header (its fingerprint), never used for matching (no messages).

    Raises:
        CommError: not the MPI transport, ranks on several real nodes, or ranks disagree on
            numel/dtype/op (raised on every rank).
        ValueError: a device (CuPy) or non-contiguous array; ``tag`` on a stream other than 0;
            a group on several (virtual) nodes (every rank raises before any message).
    """
    n = transport.size
    if n == 1:
        finalize(buf, op, n)
        return
    if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
        raise ValueError(f"[rank {transport.rank}/{n}] all_reduce(algorithm=\"shm\"): needs a "
                         f"C-contiguous NumPy array, got {type(buf).__name__}. Use "
                         f"algorithm='ring' for device arrays.")
    if stream_of(tag):
        raise ValueError(f"[rank {transport.rank}/{n}] all_reduce(algorithm=\"shm\", "
                         f"tag={stream_of(tag)}): the shared window serves stream 0 only (two "
                         "threads on two streams would share its barrier). Use tag=0, another "
                         "group (new_group), or algorithm='auto'.")
    topo = detect_topology(transport)
    if topo.num_nodes > 1:
        raise ValueError(f"[rank {transport.rank}/{n}] all_reduce(algorithm=\"shm\"): the ranks "
                        f"span {topo.num_nodes} {'virtual ' if topo.virtual else ''}nodes "
                        f"{list(topo.nodes)}; shared memory is used only within one node. Use "
                        "algorithm='hier' or 'auto'.")
    node_all_reduce(shm_node(transport), buf.reshape(-1), op, tag)


def node_all_reduce(node: ShmNode, flat: np.ndarray, op: ReduceOp, tag: int = 0) -> None:
    """The shared-memory all-reduce of ``flat`` (1-D contiguous NumPy) over ``node``'s ranks:
    a small message through the mailboxes (shm_mailbox.py); a larger one writes my header,
    barrier, compare headers, then the in-place or copy path.

    The caller has checked what ``shm_all_reduce`` checks (two or more ranks on one node,
    stream 0); a mismatch between the ranks raises CollectiveMismatch on every rank.
    """
    if flat.nbytes <= SMALL_BYTES:  # by size alone: every rank takes the same path
        return mailbox_all_reduce(node, flat)(flat, op, tag)
    where = window_of(node, flat)
    early = where[0] < 0 and _copy_in_early(node, flat)
    dtype = DTYPE_CODES.get(flat.dtype, 100 + flat.dtype.num)
    node.calls += 1
    node.headers[node.rank][node.calls & 1, :7] = (flat.size, dtype, op.code, *where, early, tag)
    node.barrier("all_reduce(shm) start")
    shared, all_early = _check_headers(node)
    if shared:
        _in_place_path(node, flat, op, where)
    else:  # if any rank skipped step (1) (window too small, or its buffer is shared)
        _copy_path(node, flat, op, first_done=all_early)  # every rank redoes it


def _copy_in_early(node: ShmNode, flat: np.ndarray) -> bool:
    """Step (1) of chunk 0 before the header barrier (saves a barrier per call), when the
    scratch window already holds it; returns whether it did."""
    sc = node.extra.get("scratch")
    first = flat[: max(CHUNK_BYTES // flat.itemsize, 1)]
    if not flat.size or sc is None or first.nbytes > sc.half_bytes:
        return False
    slot = sc.slots(node.half, flat.dtype, first.size)[node.rank]
    b = line_aligned_bounds(first.size, node.size, flat.itemsize)
    _copy_in(slot, first, b[node.rank], b[node.rank + 1])
    return True


def shm_prepare(transport: Transport, flat: Any) -> Any:
    """``run(flat, op, tag)`` bound to the transport's node (``Algorithm.prepare``): what a plan
    runs once ``shm_usable`` held for its buffer kind; for a small ``flat``, its mailbox
    all-reduce itself."""
    node = shm_node(transport)
    if flat.nbytes <= SMALL_BYTES:
        return mailbox_all_reduce(node, flat)
    return functools.partial(node_all_reduce, node)


def shm_cost(n: int, k: float, a: float, b: float, g: float) -> float:
    """Modelled time: 2 barriers (a), K bytes copied in and out (b), K(n-1)/n reduced."""
    return 2 * a + k * b + k * (n - 1) / n * g


# "shm_zc": the same formula with its own constants, for a buffer already in a shared window.
SHM = Algorithm("shm", shm_all_reduce, usable=shm_usable, cost=shm_cost,
                constants=model(8.0, 2.5e-4), variants={"shm_zc": model(8.0, 1.0e-4)},
                prepare=shm_prepare)


__all__ = ["CHUNK_BYTES", "SHM", "finite_fast", "line_aligned_bounds", "reduced_finite",
           "scratch_window", "shm_all_reduce",
           "shm_alloc_buffer", "shm_available", "shm_close", "shm_is_shared", "shm_usable"]
