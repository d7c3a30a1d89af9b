"""``torch.utils.checkpoint`` by its path: ``from minidist.utils.checkpoint import checkpoint``.

    from minidist.utils.checkpoint import checkpoint, checkpoint_sequential  # torch's spelling
    from minidist.utils import checkpoint                                    # also works:
    h = checkpoint(block, x, use_reentrant=False)                            # the module calls

torch's path is a module holding the function ``checkpoint``, while minidist's older spelling
``from minidist.utils import checkpoint`` gives a function; so this module is callable too
(calling it calls :func:`checkpoint`), and both spellings work. The functions live in
``minidist.utils.checkpointing``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from minidist.utils.checkpointing import checkpoint, checkpoint_sequential

__all__ = ["checkpoint", "checkpoint_sequential"]


class CallableModule(types.ModuleType):
    """This module, callable as its ``checkpoint`` function."""

    def __call__(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(function, *args, **kwargs)


sys.modules[__name__].__class__ = CallableModule
