"""The Reducer: turns gradients written by backward into averaged gradients, bucket by bucket.

    reducer = Reducer(params, names, buckets, overlap=True)
    reducer.prepare_for_forward()        # DDP.forward calls this: new step (None grads stay None)
    out = module(x)
    reducer.mark_unused(unused)          # find_unused_parameters: those out does not reach
    loss.backward()                      # hooks fire; returns with every bucket averaged

Bucket, reduce, average, done. How one synced backward runs (overlap=True; 3 buckets,
bucket 0 holds the last layer)::

    main thread (backward)                          comm thread
    grad fc3.b, fc3.w -> bucket 0 READY ---launch-->  comm_hook(bucket 0): all-reduce AVG
    grad fc2.b, fc2.w -> bucket 1 READY ---launch-->  comm_hook(bucket 1)   (queued)
    grad fc1.b, fc1.w -> bucket 2 READY ---launch-->  comm_hook(bucket 2)
    last hook: wait until the comm thread is done  <-- done
    loss.backward() returns: every p.grad (a view of its bucket) holds the average

With overlap=False the same launches just run on the main thread when the last hook fires.

Where the gradients live: every parameter's bucket slot is its gradient destination
(``minidist.tensor.GradDestination``), so backward writes each gradient straight into the
buffer the all-reduce sends (linear's weight gradient is the GEMM's own output there), with
no gradient array allocated and copied in; ``zero_grad()`` sets ``p.grad = None`` and forward
leaves it so (no memset). The comm hook turns the bucket into the average (hooks.py; the
default, ``avg_allreduce_hook``, is one all-reduce with op AVG).

Rules that keep every rank in step:
- buckets are LAUNCHED IN INDEX ORDER on every rank; if bucket 2 is ready before bucket 1, it
  waits, because collectives must be issued in the same order everywhere;
- the sync point is the hook that completes the LAST bucket: it launches it and then waits for
  the comm thread, so backward returns only when all buckets are reduced;
- the first hook of a synced backward queues an end-of-backward check on the tape
  (``minidist.tensor.queue_callback``). When the backward is over, the check finds the step
  finalized, or it raises right there, naming the parameters that got no gradient (so their
  bucket never became ready and was never reduced). That happens before ``optimizer.step()``
  can apply gradients that were never averaged; the rank that raises ends the job through
  the excepthook, so its peers, blocked in that bucket's all-reduce, do not hang.
  (``find_unused_parameters=True`` marks such parameters ready right after forward instead.)
- an exception in the comm thread is kept and re-raised in the main thread, naming the bucket;
- under ``no_sync`` the hooks do nothing: gradients just accumulate in the bucket views.

What watches the step (the NaN/inf check, a GradScaler's unscale, the trace, timing stats)
is an observer (observers.py), called at four events: step start, bucket ready, bucket
reduced, step end. The NaN/inf check, the unscale and ``mark_unused`` (for
``find_unused_parameters``) are the mixin ``ReducerExtras``'s (grad_checks.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from minidist import xp as backend
from minidist.optim.grad_scaling import add_scale_listener, remove_scale_listener
from minidist.ddp.bucket import Bucket, BucketState
from minidist.ddp.comm_thread import CommThread
from minidist.ddp.grad_checks import (NONFINITE_POLICIES, ReducerExtras, bucket_failed_error,
                                      bypassed_error, missing_gradients_error)
from minidist.ddp.hooks import avg_allreduce_hook
from minidist.ddp.observers import EVENTS, ReducerObserver, overridden
from minidist.ddp.states import StepState
from minidist.logger import get_logger, rank_prefix
from minidist.tensor import GradDestination, queue_callback

log = get_logger(__name__)

# The NaN/inf check's observer, ``make(policy, rank)``: a seam the watch wing fills
# (minidist/watch/nonfinite.py NonfiniteCheck); None: no check can run.
NONFINITE_CHECK: Callable[[str, int], Any] | None = None


class Reducer(ReducerExtras):
    """Bucketed, optionally overlapped gradient averaging for a list of parameters.

    Args:
        params: the parameters that need gradients, in registration order.
        names: their names (``fc1.weight``), used in every error message.
        buckets: the buckets (from ``plan_buckets``), in launch order, with their buffers and
            the process group they are reduced over.
        overlap: reduce buckets on a comm thread during backward (True) or all at the end.
        find_unused_parameters: see :class:`minidist.ddp.DistributedDataParallel`.
        nonfinite_grads: ``"warn"`` (once, then count), ``"raise"`` or ``"ignore"`` a NaN/inf
            after a reduction (grad_checks.py; not for buckets a GradScaler unscales).
        rank: this process's rank in the group (names the ranks in the non-finite report).
    """

    def __init__(self, params: Sequence[Any], names: Sequence[str], buckets: Sequence[Bucket],
                 *, overlap: bool = True, find_unused_parameters: bool = False,
                 nonfinite_grads: str = "warn", rank: int = 0) -> None:
        if nonfinite_grads not in NONFINITE_POLICIES:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: nonfinite_grads="
                             f"{nonfinite_grads!r}; use one of {NONFINITE_POLICIES}.")
        self.rank = rank
        self.params = list(params)
        self.names = list(names)
        self.buckets = list(buckets)
        self.world_size = self.buckets[0].world_size if self.buckets else 1
        # what the default hook divides the summed gradients by: the world size, or under
        # DistributedDataParallel.join() the number of ranks that contribute this step
        self.divisor = self.world_size
        self.overlap = overlap
        self.find_unused_parameters = find_unused_parameters
        self.require_sync = True  # False inside no_sync()
        # DDP sets it: a synced backward must follow a forward through the wrapper (else the
        # inner model was called: bypassed_error). Off, such a backward only accumulates.
        self.forward_required = False
        self._comm_hook: Callable[[Any, Bucket], None] = avg_allreduce_hook
        self._hook_observer: ReducerObserver | None = None  # what the comm hook brought
        self.hook_state: Any = None
        self.num_syncs = 0  # completed synced backward passes (the "step" in messages)
        self.step_state = StepState.IDLE
        self._next_launch = 0
        self._unused: list[int] = []  # this step: parameters marked ready before backward
        self._observers: list[ReducerObserver] = []  # every step
        self._step_observers: list[ReducerObserver] = []  # this step only
        self._calls: dict[str, list[Callable[..., None]]] = {e: [] for e in EVENTS}
        # parameter position -> (bucket, slot in bucket)
        self._slot: dict[int, tuple[Bucket, int]] = {}
        # parameter position -> its reserved gradient slot: backward writes the gradient there
        self.grad_dests: list[GradDestination] = [None] * len(params)  # type: ignore[list-item]
        for b in self.buckets:
            for k, i in enumerate(b.spec.param_indices):
                self._slot[i] = (b, k)
                self.grad_dests[i] = GradDestination(b.views[k])
                self.params[i].grad_destination = self.grad_dests[i]
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                         for i, p in enumerate(self.params)]
        device = getattr(self.buckets[0].buffer, "device", None) if self.buckets and \
            self.buckets[0].on_device else None
        self._thread = CommThread(self._reduce_bucket, device) if overlap else None
        for b in self.buckets:
            b.attach_grads()
        self._nonfinite: Any = None  # the NaN/inf check's observer (NONFINITE_CHECK's)
        self._nonfinite_policy = "ignore"
        self.nonfinite_grads = nonfinite_grads
        add_scale_listener(self._use_scaler)  # a GradScaler's scale() on this thread

    # ------------------------------------------------------------------ observers

    @property
    def comm_hook(self) -> Callable[[Any, Bucket], None]:
        """``hook(state, bucket)``: what turns a ready bucket into the average (hooks.py).
        A hook may bring a Reducer observer (its ``observer`` attribute, a class): it is
        registered while the hook is this one."""
        return self._comm_hook

    @comm_hook.setter
    def comm_hook(self, hook: Callable[[Any, Bucket], None]) -> None:
        if self._hook_observer is not None:
            self.remove_observer(self._hook_observer)
        make = getattr(hook, "observer", None)
        self._hook_observer = make() if make is not None else None
        if self._hook_observer is not None:
            self.add_observer(self._hook_observer)
        self._comm_hook = hook

    def add_observer(self, observer: ReducerObserver, step: bool = False) -> None:
        """Call ``observer`` at the events it overrides (observers.py): from now on, or with
        ``step=True`` for this step only (the next ``prepare_for_forward`` drops it)."""
        (self._step_observers if step else self._observers).append(observer)
        self._rebuild_calls()

    def remove_observer(self, observer: ReducerObserver) -> None:
        """Stop calling ``observer`` (a no-op if it is not registered)."""
        for group in (self._observers, self._step_observers):
            if observer in group:
                group.remove(observer)
        self._rebuild_calls()

    def observers(self) -> list[ReducerObserver]:
        """The registered observers, this step's first (in the order they are called)."""
        return self._step_observers + self._observers

    def _rebuild_calls(self) -> None:
        self._calls = {e: [getattr(o, e) for o in self.observers() if overridden(o, e)]
                       for e in EVENTS}

    # ------------------------------------------------------------------ step boundaries

    def prepare_for_forward(self) -> None:
        """Start a step: re-attach user-set grads, reset the buckets (a step that an exception
        interrupted is simply started over)."""
        for b in self.buckets:
            # None grads stay None: backward writes them into their reserved slots.
            if b.attach_grads(zero_missing=False):
                log.debug("bucket %d: user-assigned grads copied into the bucket", b.index)
        if self._step_observers:
            self._step_observers = []
            self._rebuild_calls()
        if self.require_sync:
            self._unused = []
            for b in self.buckets:
                b.reset()
                b.divisor = self.divisor
            self._next_launch = 0
        self.step_state = StepState.PREPARED if self.require_sync else StepState.IDLE
        for call in self._calls["step_start"]:
            call(self)

    # ------------------------------------------------------------------ hooks

    def _make_hook(self, i: int) -> Callable[[Any], None]:
        def hook(_tensor: Any) -> None:
            if self.require_sync and self.step_state is not StepState.IDLE:
                if self.step_state is StepState.PREPARED:  # first gradient of this backward
                    self.step_state = StepState.BACKWARD
                    queue_callback(self._end_of_backward)
                self._grad_ready(i)
            elif self.require_sync and self.forward_required:  # no DDP forward before it
                raise bypassed_error(self.names[i], self.num_syncs)
        return hook

    def _end_of_backward(self) -> None:
        """Runs once when a synced backward has finished: every bucket must have been reduced.

        A bucket that never became ready means some parameter got no gradient on THIS rank:
        the peers wait in its all-reduce. Raise now (the third rule of the module docstring).
        """
        if self.step_state is StepState.IDLE:  # finalized by the hook of the last bucket
            return
        if self._thread is not None:
            # Finish the buckets that were launched: the peers launched them too (same order).
            self._thread.wait_all()
            if self._thread.error is not None:  # secondary: the missing gradient comes first
                log.warning("bucket %d also failed: %r", self._thread.error[0].index,
                            self._thread.error[1])
                self._thread.error = None
        self.step_state = StepState.IDLE
        raise missing_gradients_error(self.buckets, self.buckets[self._next_launch:],
                                      self.num_syncs, self.find_unused_parameters)

    def _grad_ready(self, i: int) -> None:
        bucket, k = self._slot[i]
        p, view = self.params[i], bucket.views[k]
        g = None if p.grad is None else p.grad.array
        if g is not view:  # no gradient (an unused parameter), or one assigned after
            view[...] = 0 if g is None else g  # forward: into the slot, one pass
            p.grad = view
        if not bucket.mark_slot_done(k):  # more to come (a second report changes nothing)
            return
        # Launch ready buckets strictly in index order (the same order on every rank).
        while (self._next_launch < len(self.buckets)
               and self.buckets[self._next_launch].state is BucketState.READY):
            b = self.buckets[self._next_launch]
            self._next_launch += 1
            b.state = BucketState.REDUCING
            for call in self._calls["bucket_ready"]:
                call(b)
            if self._thread is not None:
                self._thread.submit(b)
        if self._next_launch == len(self.buckets):
            self._finalize()

    def _finalize(self) -> None:
        """All buckets launched: wait for them (or run them now without overlap), then done."""
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
        self.step_state = StepState.IDLE
        self.num_syncs += 1
        for call in self._calls["step_end"]:
            call(self)

    def _raise_bucket_error(self, bucket: Bucket, err: BaseException) -> None:
        self.step_state = StepState.IDLE
        raise bucket_failed_error(bucket, err, self.num_syncs) from err

    # ------------------------------------------------------------------ reduction

    def _reduce_bucket(self, bucket: Bucket) -> None:
        if bucket.on_device:  # GPU: the kernels that wrote the gradients must be done
            backend.synchronize(bucket.buffer)
        self._comm_hook(self.hook_state, bucket)  # default: hooks.avg_allreduce_hook
        bucket.state = BucketState.REDUCED
        for call in self._calls["bucket_reduced"]:
            call(bucket)

    def close(self) -> None:
        """Remove the gradient hooks and destinations, and stop the comm thread."""
        remove_scale_listener(self._use_scaler)
        for h in self._handles:
            h.remove()
        self._handles = []
        for p, d in zip(self.params, self.grad_dests):
            if p.grad_destination is d:  # backward allocates p.grad again from now on
                p.grad_destination = None
        if self._thread is not None:
            self._thread.close()
            self._thread = None
