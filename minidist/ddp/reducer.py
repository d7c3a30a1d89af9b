"""The Reducer: turns gradients written by backward into averaged gradients, bucket by bucket.

    reducer = Reducer(params, names, buckets, all_reduce_fn, world_size, overlap=True)
    reducer.prepare_for_forward()        # DDP.forward calls this: re-attach grad views, new step
    reducer.prepare_for_backward(out)    # after forward: with find_unused_parameters, mark the
                                         # parameters the output does not depend on as ready
    loss.backward()                      # hooks fire; returns with every bucket averaged

How one synced backward runs (overlap=True; 3 buckets, bucket 0 holds the last layer)::

    main thread (backward)                          comm thread
    grad fc3.b, fc3.w -> bucket 0 READY ---launch-->  all_reduce(bucket 0)
    grad fc2.b, fc2.w -> bucket 1 READY ---launch-->  all_reduce(bucket 1)   (queued behind 0)
    grad fc1.b, fc1.w -> bucket 2 READY ---launch-->  all_reduce(bucket 2)
    last hook: wait until the comm thread is done  <-- done; NaN/inf check on the way
    loss.backward() returns: every p.grad (a view of its bucket) holds the average

Rules that keep every rank in step:
- buckets are LAUNCHED IN INDEX ORDER on every rank; if bucket 2 is ready before bucket 1, it
  waits, because collectives must be issued in the same order everywhere;
- the sync point is the hook that completes the LAST bucket: it launches it and then waits for
  the comm thread, so backward returns only when all buckets are reduced. (There is no
  end-of-backward callback in the tape; the last hook is one. A parameter that never gets a
  gradient would leave the step unfinished, which is why find_unused_parameters exists.)
- an exception in the comm thread is kept and re-raised in the main thread, naming the bucket;
- under ``no_sync`` the hooks do nothing: gradients just accumulate in the bucket views.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Sequence

from minidist import xp as backend
from minidist.ddp.bucket import Bucket, BucketState
from minidist.ddp.hooks import GradBucket, allreduce_hook
from minidist.log import get_logger, rank_prefix

log = get_logger(__name__)

NONFINITE_POLICIES = ("warn", "raise", "ignore")


class _CommThread:
    """One daemon thread that runs bucket reductions in the order they are submitted."""

    def __init__(self, work: Callable[[Bucket], None]) -> None:
        self._work = work
        self._queue: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._outstanding = 0
        self.error: tuple[Bucket, BaseException] | None = None
        self._thread = threading.Thread(target=self._run, name="minidist-ddp-comm", daemon=True)
        self._thread.start()

    def submit(self, bucket: Bucket) -> None:
        with self._cond:
            self._outstanding += 1
        self._queue.put(bucket)

    def _run(self) -> None:
        while True:
            bucket = self._queue.get()
            if bucket is None:
                return
            try:
                if self.error is None:  # after a failure the collectives are out of step: skip
                    self._work(bucket)
            except BaseException as e:  # kept for the main thread, which re-raises it
                self.error = (bucket, e)
            finally:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()

    def wait_all(self) -> None:
        """Block until every submitted bucket is done (each collective has its own deadline)."""
        with self._cond:
            while self._outstanding:
                self._cond.wait(timeout=1.0)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5.0)


class Reducer:
    """Bucketed, optionally overlapped gradient averaging for a list of parameters.

    Args:
        params: the parameters that need gradients, in registration order.
        names: their names (``fc1.weight``), used in every error message.
        buckets: the buckets (from ``plan_buckets``), in launch order, with their buffers.
        all_reduce: ``all_reduce(array, op)`` on the DDP's process group and algorithm.
        world_size: number of ranks.
        overlap: reduce buckets on a comm thread during backward (True) or all at the end.
        find_unused_parameters: see :class:`minidist.ddp.DistributedDataParallel`.
        nonfinite_grads: ``"warn"``, ``"raise"`` or ``"ignore"`` a NaN/inf after a reduction.
    """

    def __init__(self, params: Sequence[Any], names: Sequence[str], buckets: Sequence[Bucket],
                 all_reduce: Callable[[Any, str], None], world_size: int, *, overlap: bool = True,
                 find_unused_parameters: bool = False, nonfinite_grads: str = "warn") -> None:
        if nonfinite_grads not in NONFINITE_POLICIES:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: nonfinite_grads="
                             f"{nonfinite_grads!r}; use one of {NONFINITE_POLICIES}.")
        self.params = list(params)
        self.names = list(names)
        self.buckets = list(buckets)
        self.all_reduce = all_reduce
        self.world_size = world_size
        self.overlap = overlap
        self.find_unused_parameters = find_unused_parameters
        self.nonfinite_grads = nonfinite_grads
        self.require_sync = True  # False inside no_sync()
        self.comm_hook: Callable[[Any, GradBucket], None] = allreduce_hook
        self.hook_state: Any = None
        self.num_syncs = 0  # completed synced backward passes (the "step" in messages)
        self.stats = {"wait_s": 0.0, "comm_s": 0.0}  # last step: exposed wait, comm thread busy
        self._next_launch = 0
        self._in_step = False  # a synced step is prepared and not yet finalized
        self._hooks_fired = False  # some gradient arrived in the current synced step
        self._comm_busy_s = 0.0
        # parameter position -> (bucket, slot in bucket)
        self._slot: dict[int, tuple[Bucket, int]] = {}
        for b in self.buckets:
            for k, i in enumerate(b.spec.param_indices):
                self._slot[i] = (b, k)
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                         for i, p in enumerate(self.params)]
        self._thread = _CommThread(self._reduce_bucket) if overlap else None
        for b in self.buckets:
            b.attach_grads()

    # ------------------------------------------------------------------ step boundaries

    def prepare_for_forward(self) -> None:
        """Start a step: check the last one finished, re-attach grad views, reset buckets."""
        if self._in_step and self._hooks_fired:
            missing = [n for b in self.buckets for n in b.missing_names()]
            self._in_step = False
            raise RuntimeError(
                f"{rank_prefix()} DistributedDataParallel: the previous backward (step "
                f"{self.num_syncs}) finished without a gradient for {len(missing)} parameter(s): "
                f"{missing[:8]}{'...' if len(missing) > 8 else ''}, so their buckets were never "
                "reduced. These parameters were not used to compute the loss. Pass "
                "find_unused_parameters=True to DistributedDataParallel (they are then reduced "
                "as zeros), or remove them from the model.")
        for b in self.buckets:
            if b.attach_grads():
                log.debug("bucket %d: grad views re-attached (zero_grad set them to None?)",
                          b.index)
        if not self.require_sync:
            self._in_step = False
            return
        for b in self.buckets:
            b.reset()
        self._next_launch = 0
        self._in_step = True
        self._hooks_fired = False
        self._comm_busy_s = 0.0
        self.stats = {"wait_s": 0.0, "comm_s": 0.0}

    def mark_unused(self, unused: Sequence[int]) -> None:
        """Mark parameters that will get no gradient this step as ready (reduced as they are).

        Their bucket slots keep what they hold: zeros after ``zero_grad``, or the gradient
        accumulated under ``no_sync``. Called right after forward, before backward starts.
        """
        if not self._in_step:
            return
        for i in unused:
            self._grad_ready(i, from_hook=False)
        if unused:
            log.debug("step %d: %d unused parameter(s) marked ready", self.num_syncs, len(unused))

    # ------------------------------------------------------------------ hooks

    def _make_hook(self, i: int) -> Callable[[Any], None]:
        def hook(_tensor: Any) -> None:
            if self.require_sync and self._in_step:
                self._hooks_fired = True
                self._grad_ready(i, from_hook=True)
        return hook

    def _grad_ready(self, i: int, from_hook: bool) -> None:
        bucket, k = self._slot[i]
        p = self.params[i]
        if p.grad is not bucket.views[k]:  # backward rebound .grad: fold it back into the bucket
            bucket.views[k][...] = 0 if p.grad is None else p.grad
            p.grad = bucket.views[k]
        if not bucket.mark_ready(k):
            return
        # Launch ready buckets strictly in index order (the same order on every rank).
        while (self._next_launch < len(self.buckets)
               and self.buckets[self._next_launch].state is BucketState.READY):
            b = self.buckets[self._next_launch]
            self._next_launch += 1
            b.state = BucketState.REDUCING
            if self._thread is not None:
                self._thread.submit(b)
        if self._next_launch == len(self.buckets):
            self._finalize()

    def _finalize(self) -> None:
        """All buckets launched: wait for them (or run them now without overlap), then check."""
        t0 = time.perf_counter()
        if self._thread is not None:
            self._thread.wait_all()
            if self._thread.error is not None:
                bucket, err = self._thread.error
                self._thread.error = None
                self._raise_bucket_error(bucket, err)
        else:
            for b in self.buckets:
                try:
                    self._reduce_bucket(b)
                except Exception as err:
                    self._raise_bucket_error(b, err)
        self.stats = {"wait_s": time.perf_counter() - t0, "comm_s": self._comm_busy_s}
        self._in_step = False
        self.num_syncs += 1
        self._check_finite()

    def _raise_bucket_error(self, bucket: Bucket, err: BaseException) -> None:
        self._in_step = False
        raise RuntimeError(
            f"{rank_prefix()} DistributedDataParallel: all-reduce of bucket {bucket.index} "
            f"({bucket.spec.numel} x {bucket.spec.dtype}, parameters {bucket.names[:4]}"
            f"{'...' if len(bucket.names) > 4 else ''}) failed at step {self.num_syncs}: "
            f"{type(err).__name__}: {err}. Check the other ranks' logs; every rank must run the "
            "same model and the same steps.") from err

    # ------------------------------------------------------------------ reduction

    def _reduce_bucket(self, bucket: Bucket) -> None:
        t0 = time.perf_counter()
        backend.synchronize(bucket.buffer)  # GPU: kernels writing the grads must be done
        grad_bucket = GradBucket(bucket, self.all_reduce, self.world_size,
                                 is_last=bucket.index == len(self.buckets) - 1)
        self.comm_hook(self.hook_state, grad_bucket)
        if self.nonfinite_grads != "ignore":
            # One sum, right after the reduction (the buffer is still in cache, and with
            # overlap it runs on the comm thread): NaN and inf propagate through a sum, so a
            # finite sum proves a finite bucket, without isfinite's boolean temporary.
            xp = backend.get_array_module(bucket.buffer)
            bucket.finite = bool(xp.isfinite(bucket.buffer.sum()))
        bucket.state = BucketState.REDUCED
        self._comm_busy_s += time.perf_counter() - t0

    def _check_finite(self) -> None:
        # Each bucket's sum was checked right after its reduction (_reduce_bucket); only a
        # bucket whose sum is not finite is searched for the parameters to name.
        if self.nonfinite_grads == "ignore":
            return
        bad = []
        for b in self.buckets:
            if b.finite:
                continue
            xp = backend.get_array_module(b.buffer)
            bad += [n for n, v in zip(b.names, b.views) if not bool(xp.isfinite(v).all())]
        if not bad:
            return
        msg = (f"{rank_prefix()} DistributedDataParallel: non-finite (NaN/inf) averaged gradient "
               f"at step {self.num_syncs - 1} in {bad[:8]}{'...' if len(bad) > 8 else ''}. "
               "Lower the learning rate, clip gradients, or check the inputs of that step.")
        if self.nonfinite_grads == "raise":
            raise FloatingPointError(msg)
        log.warning(msg)

    def close(self) -> None:
        """Remove the gradient hooks and stop the comm thread."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._thread is not None:
            self._thread.close()
            self._thread = None


def unused_param_indices(outputs: Any, params: Sequence[Any],
                         parents: Callable[[Any], Sequence[Any]]) -> list[int]:
    """Indices of ``params`` the autograd graph of ``outputs`` does not reach.

    Args:
        outputs: a Tensor, or a (nested) tuple/list/dict of them, as returned by forward.
        params: the parameters, in registration order.
        parents: returns the input tensors a tensor was computed from.
    """
    stack: list[Any] = []

    def collect(o: Any) -> None:
        if isinstance(o, (list, tuple)):
            for x in o:
                collect(x)
        elif isinstance(o, dict):
            for x in o.values():
                collect(x)
        elif hasattr(o, "data") and hasattr(o, "grad"):
            stack.append(o)

    collect(outputs)
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.extend(parents(t))
    return [i for i, p in enumerate(params) if id(p) not in seen]

