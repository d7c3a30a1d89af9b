"""torch's ``nn.utils``: gradient clipping (implemented in ``minidist.tensor.clip_grad``, so
``minidist.optim.clip_grad_norm_`` is the same function).

    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
"""

from __future__ import annotations

from minidist.tensor import clip_grad_norm_, clip_grad_value_

__all__ = ["clip_grad_norm_", "clip_grad_value_"]
