"""torch's ``ddp_comm_hooks.default_hooks``: ``allreduce_hook`` (the plain average) and
``fp16_compress_hook`` (average in float16), the hooks of ``minidist.ddp.hooks``.

    model.register_comm_hook(None, default_hooks.fp16_compress_hook)

torch's hooks take a process group as state; minidist's hooks reduce over the DDP's own group,
so the state is ignored (pass None, or the group the DDP was built with).
"""

from minidist.ddp.hooks import allreduce_hook, fp16_compress_hook

__all__ = ["allreduce_hook", "fp16_compress_hook"]
