"""``torch.cuda.amp`` (the older spelling many scripts still use), as ``minidist.cuda.amp``:

    from minidist.cuda.amp import GradScaler, autocast     # was: from torch.cuda.amp import ...
    scaler = GradScaler()
    with autocast():
        loss = model(x).sum()

They are ``minidist.amp``'s classes with ``device="cuda"`` filled in, as torch's are
deprecated aliases of ``torch.amp``'s. So they behave as torch's do on a machine without a GPU:
``autocast()`` casts only CUDA (CuPy) arrays and leaves CPU ops alone, and ``GradScaler()``
logs "GradScaler is enabled, but CUDA is not available. Disabling." and then passes losses
and steps through unscaled. For float16 on the CPU use ``minidist.amp.autocast("cpu")`` and
``minidist.amp.GradScaler("cpu")``. The package root makes this module ``minidist.cuda.amp``
(``cuda`` sits below ``amp`` in the layers, so it cannot import it itself).
"""

from __future__ import annotations

from typing import Any

from minidist.amp import autocast_mode, grad_scaler


class autocast(autocast_mode.autocast):  # noqa: N801 - torch's name
    """torch's ``torch.cuda.amp.autocast(enabled=True, dtype=torch.float16,
    cache_enabled=True)``: ``minidist.amp.autocast("cuda", dtype, enabled)``."""

    def __init__(self, enabled: bool = True, dtype: Any = "float16",
                 cache_enabled: bool = True) -> None:
        super().__init__("cuda", dtype, enabled)


class GradScaler(grad_scaler.GradScaler):
    """torch's ``torch.cuda.amp.GradScaler(init_scale=2.**16, growth_factor=2.0,
    backoff_factor=0.5, growth_interval=2000, enabled=True)``: ``minidist.amp.GradScaler`` on
    ``"cuda"`` (disabled, with a warning, where no GPU is usable, as torch)."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval,
                         enabled)


__all__ = ["autocast", "GradScaler"]
