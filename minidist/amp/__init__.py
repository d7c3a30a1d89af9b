"""Mixed precision: autocast (float16 compute), GradScaler (loss scaling), MasterWeights.

    from minidist import amp
    scaler = amp.GradScaler()
    for x, y in loader:
        with amp.autocast("cpu", dtype=amp.float16):   # "cuda" on a GPU (float16 there)
            loss = loss_fn(model(x), y)            # matmuls in float16, the loss in float32
        scaler.scale(loss).backward()
        scaler.step(opt)                           # skipped when a gradient is inf/NaN
        scaler.update()
        opt.zero_grad()

Modules: ``autocast_mode`` (the context manager; the state and op lists live in
``minidist.tensor.autocast_mode``), ``grad_scaler`` (GradScaler, OptState, the DDP fold;
its per-step state in ``scaler_state``, its accessors and state_dict in ``scaler_settings``,
the unfused unscale in ``scaled_values``),
``master_weights`` (float16 model weights with float32 masters), ``overflow`` (reports of
skipped steps, the scale-floor warning). docs/amp.md explains them.
On the CPU float16 matrix products are emulated (float32 BLAS, rounded to float16): same
numbers as a GPU's float16 GEMM, not faster.
"""

from minidist.amp.autocast_mode import autocast, float16, get_autocast_dtype, is_autocast_enabled
from minidist.amp.grad_scaler import GradScaler, OptState, active_scaler
from minidist.amp.master_weights import MasterParameter, MasterWeights, owner_of
from minidist.amp.overflow import SCALE_FLOOR
from minidist.optim.grad_scaling import add_scale_listener, remove_scale_listener

__all__ = [
           "SCALE_FLOOR",
           "GradScaler",
           "MasterParameter",
           "MasterWeights",
           "OptState",
           "active_scaler", "add_scale_listener", "remove_scale_listener",
           "autocast",
           "float16",
           "get_autocast_dtype",
           "is_autocast_enabled",
           "owner_of",
]
