"""torch.utils.checkpoint's ``checkpoint`` and ``checkpoint_sequential``.

    from minidist.utils import checkpoint_sequential
    out = checkpoint_sequential(model, segments=3, input=x)   # model: nn.Sequential

``checkpoint_sequential`` cuts the layers into ``segments`` consecutive runs and checkpoints
each (torch checkpoints all but the last; here every segment is, so "checkpoint every block"
is ``segments=len(model)``). Only the segment boundaries stay in memory during forward; each
segment's activations are rebuilt, one segment at a time, as backward reaches it. See
``minidist.tensor.checkpoint`` for the mechanism and docs/memory.md for the measured savings.
"""

from __future__ import annotations

from typing import Any

from minidist.tensor.checkpoint import checkpoint, segments_of

__all__ = ["checkpoint", "checkpoint_sequential"]


def checkpoint_sequential(functions: Any, segments: int, input: Any,  # noqa: A002 - torch's name
                          use_reentrant: bool | None = None, *,
                          preserve_rng_state: bool = True) -> Any:
    """Run a Sequential (or a list of modules) in ``segments`` checkpointed segments.

    Args:
        functions: an ``nn.Sequential`` or a list of modules, applied in order.
        segments: how many checkpointed runs to cut the layers into (1..len(functions)).
        input: the input Tensor.
        use_reentrant: accepted and not passed on (see ``checkpoint``).
        preserve_rng_state: replay dropout masks in the recomputation (see ``checkpoint``).

    Returns:
        The output, the same as ``functions(input)``, with gradients to match.

    Raises:
        ValueError: ``segments`` out of range.

    Example::

        >>> from minidist import nn
        >>> from minidist.tensor import Tensor
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> out = checkpoint_sequential(net, 3, Tensor([[1.0, 2.0, 3.0, 4.0]]))
        >>> out.shape
        (1, 2)
    """
    x = input
    for segment in segments_of(list(functions), segments):
        x = checkpoint(_Segment(segment), x, use_reentrant=use_reentrant,
                       preserve_rng_state=preserve_rng_state)
    return x


class _Segment:
    """A run of modules applied in order; ``parameters()`` lets checkpoint find their weights."""

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers

    def parameters(self) -> Any:
        for layer in self.layers:
            yield from layer.parameters()

    def __call__(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x
