"""``torch.distributed.algorithms.ddp_comm_hooks`` by its path, as the guides import it:

    from minidist.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)

The hooks themselves live in ``minidist.ddp.hooks``; these modules give them torch's names.
"""

from minidist.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

__all__ = ["default_hooks", "powerSGD_hook"]
