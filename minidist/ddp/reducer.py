"""The Reducer: turns gradients written by backward into averaged gradients, bucket by bucket.

    reducer = Reducer(params, names, buckets, all_reduce_fn, world_size, overlap=True)
    reducer.prepare_for_forward()        # DDP.forward calls this: new step (None grads stay None)
    out = module(x)
    reducer.watch_output(out)            # keep a reference, checked only if a NaN/inf shows up
    reducer.mark_unused(unused_param_indices(out, params, parents))  # find_unused_parameters:
                                         # parameters the output does not reach are ready now
    loss.backward()                      # hooks fire; returns with every bucket averaged

How one synced backward runs (overlap=True; 3 buckets, bucket 0 holds the last layer)::

    main thread (backward)                          comm thread
    grad fc3.b, fc3.w -> bucket 0 READY ---launch-->  all_reduce(bucket 0, SUM)
    grad fc2.b, fc2.w -> bucket 1 READY ---launch-->  all_reduce(bucket 1, SUM)  (queued)
    grad fc1.b, fc1.w -> bucket 2 READY ---launch-->  all_reduce(bucket 2, SUM)
    last hook: wait until the comm thread is done  <-- done; NaN/inf check on the way
    loss.backward() returns: every p.grad (a view of its bucket) holds the average

With overlap=False the same launches just run on the main thread when the last hook fires.

Passes over the gradient memory per step (what makes DDP cheap next to one process)::

    every parameter has its bucket slot reserved as its gradient destination
        (p.grad_destination, minidist.tensor.GradDestination), with scale 1/n for a synced step
    zero_grad() sets p.grad = None; forward leaves it None (no memset of the buckets)
    backward writes p.grad straight into the slot, already divided by n: linear's weight
        gradient is the GEMM's own output there (the 1/n multiplies its 64-row operand), other
        ops' results are copied in once; no gradient is allocated and then copied (zero-copy)
        and the all-reduce is a plain SUM (the average costs no pass, as torch's div_factor;
        a grad already in the slot before the backward, e.g. under no_sync, is divided there)
    all-reduce SUM of the bucket; NaN/inf check: one dot product (all_finite_fast); at one
        rank (nothing to reduce) per gradient, right after backward wrote it (still in cache)

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

With a GradScaler each bucket is unscaled right after its all-reduce (in place of the NaN/inf
check); without one, a NaN/inf after the reduction is reported (grad_checks.py).
"""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, Sequence


from minidist import comm, trace
from minidist import xp as backend
from minidist.amp import active_scaler
from minidist.comm.failure.advice import failure_advice, sentence
from minidist.ddp.bucket import Bucket, BucketState
from minidist.ddp.comm_thread import CommThread
from minidist.ddp.grad_checks import (all_finite_fast, float_arrays, missing_gradients_error,
                                      nonfinite_names, report_nonfinite, where_it_started)
from minidist.ddp.hooks import GradBucket, allreduce_hook, wants_prescaled
from minidist.ddp.states import StepState, SyncMode
from minidist.log import get_logger, rank_prefix
from minidist.tensor import GradDestination, queue_callback

log = get_logger(__name__)

NONFINITE_POLICIES = ("warn", "raise", "ignore")
_MAX_WATCHED_OUTPUTS = 64  # forward outputs kept between syncs (no_sync micro-batches)


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
        nonfinite_grads: ``"warn"`` (once, then count), ``"raise"`` or ``"ignore"`` a NaN/inf
            after a reduction (not used for buckets a GradScaler unscales).
        rank: this process's rank in the group (names the ranks in the non-finite report).
    """

    def __init__(self, params: Sequence[Any], names: Sequence[str], buckets: Sequence[Bucket],
                 all_reduce: Callable[[Any, str], None], world_size: int, *, overlap: bool = True,
                 find_unused_parameters: bool = False, nonfinite_grads: str = "warn",
                 rank: int = 0) -> None:
        if nonfinite_grads not in NONFINITE_POLICIES:
            raise ValueError(f"{rank_prefix()} DistributedDataParallel: nonfinite_grads="
                             f"{nonfinite_grads!r}; use one of {NONFINITE_POLICIES}.")
        self.params = list(params)
        self.names = list(names)
        self.buckets = list(buckets)
        self.all_reduce = all_reduce
        self.world_size = world_size
        # what the default hook divides the summed gradients by: the world size, or under
        # DistributedDataParallel.join() the number of ranks that contribute this step
        self.divisor = world_size
        self.rank = rank
        self.overlap = overlap
        self.find_unused_parameters = find_unused_parameters
        self.nonfinite_grads = nonfinite_grads
        self.require_sync = True  # False inside no_sync()
        self.mode = SyncMode.NO_SYNC  # this step's (prepare_for_forward decides)
        self.comm_hook: Callable[[Any, GradBucket], None] = allreduce_hook
        self.hook_state: Any = None
        self.num_syncs = 0  # completed synced backward passes (the "step" in messages)
        self.nonfinite_grad_steps = 0  # synced steps whose reduced gradients held NaN/inf
        # forward outputs since the last sync (see watch_output); bounded: only a reference each
        self._outputs: collections.deque = collections.deque(maxlen=_MAX_WATCHED_OUTPUTS)
        self.stats = {"wait_s": 0.0, "comm_s": 0.0}  # last step: exposed wait, comm thread busy
        self._next_launch = 0
        self.step_state = StepState.IDLE
        self._check_in_hook = False  # this step: NaN/inf checked per gradient (see _grad_ready)
        self._unused: list[int] = []  # this step: parameters marked ready before backward
        self._comm_busy_s = 0.0
        # parameter position -> (bucket, slot in bucket)
        self._slot: dict[int, tuple[Bucket, int]] = {}
        self.bucket_algorithms = ["?"] * len(self.buckets)  # for traces; DDP sets the names
        # parameter position -> its reserved gradient slot: backward writes the gradient there
        self._dests: list[GradDestination] = [None] * len(self.params)  # type: ignore[list-item]
        for b in self.buckets:
            for k, i in enumerate(b.spec.param_indices):
                self._slot[i] = (b, k)
                self._dests[i] = GradDestination(b.views[k])
                self.params[i].grad_destination = self._dests[i]
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                         for i, p in enumerate(self.params)]
        device = self.buckets[0].buffer.device if self.buckets and \
            backend.is_device_array(self.buckets[0].buffer) else None
        self._thread = CommThread(self._reduce_bucket, device) if overlap else None
        for b in self.buckets:
            b.attach_grads()

    # ------------------------------------------------------------------ step boundaries

    def prepare_for_forward(self) -> None:
        """Start a step: re-attach user-set grads, reset the buckets.

        (An unfinished previous step was reported at the end of its own backward, see
        ``_end_of_backward``; one interrupted by an exception is simply started over.)
        """
        for b in self.buckets:
            # None grads stay None: backward writes them into their reserved slots.
            if b.attach_grads(zero_missing=False):
                log.debug("bucket %d: user-assigned grads copied into the bucket", b.index)
        self.mode = self._step_mode()
        if self.mode is SyncMode.NO_SYNC:
            self._reset_scales()  # no_sync: gradients accumulate as they are
            self.step_state = StepState.IDLE
            return
        # PRESCALED: the average is folded into the write into the bucket (backward writes
        # grad / n into the slot, then the hook's all-reduce SUM): no separate pass to divide.
        scale = 1.0 / self.divisor
        self._check_in_hook = False  # decided at the first gradient (a GradScaler is known then)
        self._unused = []
        for b in self.buckets:
            b.reset()
            b.finite = True
            prescaled = self._prescaled(b)
            for p, i in zip(b.params, b.spec.param_indices):
                # A slot that already holds a gradient (no_sync accumulation, zero_grad with
                # set_to_none=False) is divided in place when ready; an empty one gets grad / n.
                self._dests[i].scale = scale if prescaled and p.grad is None else 1.0
        self._next_launch = 0
        self.step_state = StepState.PREPARED
        self._comm_busy_s = 0.0
        self.stats = {"wait_s": 0.0, "comm_s": 0.0}

    def _step_mode(self) -> SyncMode:
        """This step's SyncMode (see its docstring)."""
        if not self.require_sync:
            return SyncMode.NO_SYNC
        if wants_prescaled(self.comm_hook):
            return SyncMode.PRESCALED if self.world_size > 1 else SyncMode.LOCAL
        return SyncMode.RAW

    def _prescaled(self, bucket: Bucket) -> bool:
        """This step, ``bucket``'s gradients are written divided by n (PRESCALED, floats)."""
        return self.mode is SyncMode.PRESCALED and bucket.is_float

    def mark_unused(self, unused: Sequence[int]) -> None:
        """Mark parameters that will get no gradient this step as ready (reduced as they are).

        Their bucket slots keep what they hold: zeros after ``zero_grad``, or the gradient
        accumulated under ``no_sync``. Called right after forward, before backward starts.
        """
        if self.step_state is StepState.IDLE:
            return
        self._unused = list(unused)
        for i in unused:
            self._grad_ready(i)
        if unused:
            log.debug("step %d: %d unused parameter(s) marked ready", self.num_syncs, len(unused))

    def watch_output(self, output: Any) -> None:
        """Keep a reference to this forward's output arrays (no copy, no check: free).

        Only if a reduced gradient turns out non-finite are they checked, to tell which
        ranks' forward passes already produced NaN/inf (``_check_finite``).
        """
        self._outputs.extend(float_arrays(output))

    # ------------------------------------------------------------------ hooks

    def _make_hook(self, i: int) -> Callable[[Any], None]:
        def hook(_tensor: Any) -> None:
            if self.require_sync and self.step_state is not StepState.IDLE:
                if self.step_state is StepState.PREPARED:  # first gradient of this backward
                    self.step_state = StepState.BACKWARD
                    queue_callback(self._end_of_backward)
                    # One rank with the default hook reduces nothing: check each gradient as
                    # soon as it is written (still in cache), not the buckets afterwards.
                    self._check_in_hook = (self.mode is SyncMode.LOCAL
                                           and active_scaler() is None
                                           and self.nonfinite_grads != "ignore")
                    if self._check_in_hook:
                        for j in self._unused:  # marked ready before backward started
                            b, k = self._slot[j]
                            b.finite = b.finite and all_finite_fast(b.views[k].reshape(-1))
                self._grad_ready(i)
        return hook

    def _end_of_backward(self) -> None:
        """Runs once when a synced backward has finished: every bucket must have been reduced.

        A bucket that never became ready means some parameter got no gradient on THIS rank.
        Its all-reduce was never launched here, so the peers that launched it are waiting for
        this rank, and this rank's gradients in it were never averaged. Raise now, before an
        optimizer step can use them: uncaught, the exception ends the whole job through the
        excepthook that ``init_process_group`` installs (MPI Abort), so no rank hangs.
        """
        if self.step_state is StepState.IDLE:  # finalized by the hook of the last bucket
            return
        self._reset_scales()
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

    def _reset_scales(self) -> None:
        """Gradient destinations back to scale 1 (outside a synced step nothing is averaged)."""
        for d in self._dests:
            d.scale = 1.0

    def _grad_ready(self, i: int) -> None:
        bucket, k = self._slot[i]
        if bucket.is_slot_done(k):  # a second report is ignored
            return
        p, view, dest = self.params[i], bucket.views[k], self._dests[i]
        g = p.grad
        # The gradient must be in its bucket slot, divided by n in PRESCALED mode (the hook
        # then sums, like torch's div_factor). Usually backward wrote it there already,
        # divided (the slot is its destination, with scale 1/n): nothing to do.
        prescaled = self._prescaled(bucket)
        if g is None:  # unused parameter (find_unused_parameters): reduced as zeros
            view[...] = 0
        elif g is not view:  # not in the slot (assigned after forward?): copy it in, one pass
            if prescaled and dest.scale == 1.0:
                backend.get_array_module(view).divide(g, view.dtype.type(self.divisor),
                                                      out=view)
            else:
                view[...] = g
        elif prescaled and dest.scale == 1.0:  # accumulated before this backward
            view /= view.dtype.type(self.divisor)     # (no_sync, zero_grad(set_to_none=False))
        dest.scale = 1.0  # this step's gradient is complete: a later backward is not averaged
        p.grad = view
        if self._check_in_hook and bucket.finite:
            bucket.finite = all_finite_fast(view.reshape(-1))
        if not bucket.mark_slot_done(k):
            return
        tr = trace.tracer()  # the step timeline (minidist/trace.py); None when tracing is off
        if tr is not None:
            tr.instant(f"bucket {bucket.index} ready", args={"step": self.num_syncs})
        # Launch ready buckets strictly in index order (the same order on every rank).
        while (self._next_launch < len(self.buckets)
               and self.buckets[self._next_launch].state is BucketState.READY):
            b = self.buckets[self._next_launch]
            self._next_launch += 1
            b.state = BucketState.REDUCING
            b.scaler = active_scaler()  # the GradScaler scaling this backward's loss, or None
            if tr is not None:
                tr.instant(f"bucket {b.index} launch", args={"step": self.num_syncs})
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
        tr = trace.tracer()
        if tr is not None:  # the exposed communication of this step
            tr.complete("wait for all-reduce", t0, t0 + self.stats["wait_s"], cat="exposed",
                        args={"step": self.num_syncs})
            tr.counter("exposed comm [ms]", {"ms": self.stats["wait_s"] * 1e3})
        self.step_state = StepState.IDLE
        self.num_syncs += 1
        try:
            self._check_finite()
        finally:
            self._outputs.clear()

    def _raise_bucket_error(self, bucket: Bucket, err: BaseException) -> None:
        self.step_state = StepState.IDLE
        raise RuntimeError(
            f"{rank_prefix()} DistributedDataParallel: all-reduce of bucket {bucket.index} "
            f"({bucket.spec.numel} x {bucket.spec.dtype}, parameters {bucket.names[:4]}"
            f"{'...' if len(bucket.names) > 4 else ''}) failed at step {self.num_syncs}: "
            f"{type(err).__name__}: {sentence(str(err))}. {failure_advice(err)}.") from err

    # ------------------------------------------------------------------ reduction

    def _reduce_bucket(self, bucket: Bucket) -> None:
        t0 = time.perf_counter()
        backend.synchronize(bucket.buffer)  # GPU: kernels writing the grads must be done
        # The ledger names this bucket in every collective it runs (a diagnosis then says
        # "bucket=2" beside the call site).
        with comm.ledger_label(f"bucket={bucket.index}"):
            grad_bucket = GradBucket(bucket, self.all_reduce, self.world_size,
                                     is_last=bucket.index == len(self.buckets) - 1,
                                     prescaled=self._prescaled(bucket))
            self.comm_hook(self.hook_state, grad_bucket)  # default: hooks.allreduce_hook
        if bucket.scaler is not None and bucket.scaler.unscale_bucket_(
                bucket.buffer, bucket.params, bucket.names):
            bucket.finite = True  # unscaled + checked in one pass; the scaler reports inf/NaN
        elif self.nonfinite_grads != "ignore" and not self._check_in_hook:
            bucket.finite = all_finite_fast(bucket.buffer)
        bucket.state = BucketState.REDUCED
        self._comm_busy_s += time.perf_counter() - t0
        tr = trace.tracer()
        if tr is not None:
            tr.instant(f"bucket {bucket.index} done", lane=trace.COMM,
                       args={"step": self.num_syncs})

    def _check_finite(self) -> None:
        # Each bucket was checked right after its reduction (_reduce_bucket, one dot product);
        # only a bucket that may hold NaN/inf is searched for the parameters to name.
        bad = nonfinite_names(self.buckets) if self.nonfinite_grads != "ignore" else []
        if bad:
            # Every rank is here (the reduced buckets are identical): a small collective is safe.
            self.nonfinite_grad_steps += 1
            started = where_it_started(self._outputs, self.rank, self.world_size,
                                       self.all_reduce)
            report_nonfinite(bad, self.num_syncs - 1, started, self.nonfinite_grads,
                             self.nonfinite_grad_steps)

    def close(self) -> None:
        """Remove the gradient hooks and destinations, and stop the comm thread."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for p, d in zip(self.params, self._dests):
            if p.grad_destination is d:  # backward allocates p.grad again from now on
                p.grad_destination = None
        if self._thread is not None:
            self._thread.close()
            self._thread = None
