"""``torch.backends.cuda``: ``matmul.allow_tf32`` and friends, stored and without effect (see
``minidist.backends``)."""

from __future__ import annotations


class MatmulFlags:
    """``torch.backends.cuda.matmul``: precision switches of float32/16 GEMMs (no effect)."""

    def __init__(self) -> None:
        self.allow_tf32 = False  # torch's default
        self.allow_fp16_reduced_precision_reduction = True
        self.allow_bf16_reduced_precision_reduction = True


matmul = MatmulFlags()


def is_built() -> bool:
    """False: minidist is not built against CUDA (its GPU path is CuPy's)."""
    return False


__all__ = ["matmul", "is_built", "MatmulFlags"]
