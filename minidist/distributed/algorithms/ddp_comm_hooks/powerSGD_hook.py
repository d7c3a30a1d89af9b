"""torch's ``ddp_comm_hooks.powerSGD_hook`` (the module name is torch's): ``PowerSGDState``
and ``powerSGD_hook``, backed by ``minidist.ddp.hooks`` (``PowerSGDState``,
``powersgd_hook``).

    from minidist.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)

``PowerSGDState`` takes torch's arguments (``process_group``, ``matrix_approximation_rank``,
``start_powerSGD_iter`` = 1000, ``min_compression_rate``, ``use_error_feedback``,
``warm_start``, ``random_seed``); the algorithm is described in minidist/ddp/hooks.py.
"""

from minidist.ddp.hooks import PowerSGDState, powersgd_hook

powerSGD_hook = powersgd_hook  # noqa: N816 - torch's name

__all__ = ["PowerSGDState", "powerSGD_hook"]
