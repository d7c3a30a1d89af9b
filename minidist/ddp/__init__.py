"""Data parallelism: DistributedDataParallel, its bucket planner, reducer and comm hooks.

    from minidist.ddp import DistributedDataParallel, hooks
    model = DistributedDataParallel(model, bucket_cap_mb=25)
    model.register_comm_hook(None, hooks.fp16_compress_hook)

Modules, in the order a step uses them (``naive`` is the unbucketed oracle): ``bucket`` (which
grads share a flat buffer), ``reducer`` (hooks -> ready buckets -> comm thread -> averaged
grads), ``hooks`` (how one bucket is averaged: plain; ``prescaled``: the division folded into
backward; ``compression``: fp16, PowerSGD), ``observers`` (the Reducer's observers and the
DDP extensions: the seams the wings use), ``ddp`` (the wrapper, no_sync, construction checks;
``ddp_beyond_step``: join, torch's extras, the step statistics), ``sync_batchnorm``
(SyncBatchNorm, here rather than in ``nn`` because it communicates; the root makes it
``minidist.nn.SyncBatchNorm``). The wings add ``PreflightError`` and ``check_manifest``
(watch) and ``ZeroRedundancyOptimizer`` (memory) to this package's names when they load.
"""

from minidist.ddp import hooks
from minidist.ddp.bucket import (DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES, Bucket,
                                 BucketSpec, BucketState, ParamMeta, plan_buckets)
from minidist.ddp.ddp import DistributedDataParallel
from minidist.ddp.compression import PowerSGDState, fp16_compress_hook, powersgd_hook
from minidist.ddp.hooks import (GradBucket, allreduce_hook, avg_allreduce_hook,
                                prescaled_allreduce_hook)
from minidist.ddp.naive import NaiveDataParallel
from minidist.ddp.options import auto_overlap
from minidist.ddp.reducer import Reducer
from minidist.ddp.sync_batchnorm import SyncBatchNorm

__all__ = ["DistributedDataParallel", "NaiveDataParallel", "Reducer", "Bucket", "BucketSpec", "BucketState",
           "ParamMeta", "plan_buckets", "DEFAULT_BUCKET_CAP_BYTES", "DEFAULT_FIRST_BUCKET_BYTES",
           "GradBucket", "PowerSGDState", "allreduce_hook", "avg_allreduce_hook",
           "fp16_compress_hook",
           "powersgd_hook", "prescaled_allreduce_hook", "hooks", "auto_overlap",
           "SyncBatchNorm"]
