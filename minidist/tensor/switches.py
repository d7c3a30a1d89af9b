"""torch's switches that a ported script calls but that change nothing here: ``compile``,
``set_float32_matmul_precision``, and ``torch.onnx`` (importable; exporting raises).

    model = minidist.compile(model)                    # the same model back, with a note once
    minidist.set_float32_matmul_precision("high")      # recorded; float32 products stay float32

minidist runs each op eagerly with NumPy (or CuPy) and has no graph compiler, so ``compile``
returns what it was given (a Module, or a function) and says so once per process at INFO level.
torch's matmul precision trades float32 accuracy for TensorFloat-32 speed on GPUs; NumPy's
and CuPy's float32 products are always full float32, so the setting is only remembered.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from minidist.logger import get_logger
from minidist.tensor.core import error

log = get_logger(__name__)
_noted = False
_precision = "highest"


def compile(model: Any = None, *, fullgraph: bool = False, dynamic: Any = None,  # noqa: A001
            backend: Any = "inductor", mode: Any = None, options: Any = None,
            disable: bool = False) -> Any:
    """torch's ``compile``: returns ``model`` itself (nothing is compiled); also a decorator,
    with or without arguments (``@minidist.compile``, ``@minidist.compile(mode=...)``)."""
    global _noted
    if not _noted:
        _noted = True
        log.info("minidist.compile: nothing is compiled; minidist runs each op eagerly, so "
                 "the model is returned as it is (torch.compile's speed-up does not apply).")
    if model is None:
        return lambda fn: fn
    return model


def set_float32_matmul_precision(precision: str) -> None:
    """torch's setting (``"highest"``, ``"high"``, ``"medium"``): recorded; products stay
    full float32 (no TensorFloat-32 here)."""
    global _precision
    if precision not in ("highest", "high", "medium"):
        raise ValueError(error("set_float32_matmul_precision", f"got {precision!r}; torch "
                               "accepts 'highest', 'high' or 'medium'."))
    _precision = precision


def get_float32_matmul_precision() -> str:
    return _precision


def _no_export(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(error(
            f"onnx.{name}", "minidist cannot export to ONNX: it has no traced graph (each op "
            "runs eagerly in NumPy). Export from torch: load the state dict into the same "
            "torch model (keys match) and call torch.onnx.export there."))
    refuse.__name__ = name
    return refuse


onnx = types.ModuleType("minidist.onnx", "torch.onnx's names: exporting raises (no graph here).")
onnx.export = _no_export("export")  # type: ignore[attr-defined]
onnx.dynamo_export = _no_export("dynamo_export")  # type: ignore[attr-defined]
onnx.is_in_onnx_export = lambda: False  # type: ignore[attr-defined]
sys.modules["minidist.onnx"] = onnx

__all__ = ["compile", "set_float32_matmul_precision", "get_float32_matmul_precision", "onnx"]
