"""torch's dtype names (``minidist.float32``, ``minidist.bfloat16``...) over NumPy dtypes.

    import minidist
    print(minidist.float32)                   # minidist.float32, as torch prints torch.float32
    minidist.float32 == numpy.float32         # True: each name stands for one NumPy dtype
    numpy.zeros(3, dtype=minidist.bfloat16)   # NumPy takes them wherever it takes a dtype

A ``dtype`` here is a thin name over a ``numpy.dtype``: NumPy (and CuPy) read its ``.dtype``
attribute wherever they accept a dtype, it compares and hashes equal to that NumPy dtype (so
either keys a dict), and any other attribute (``itemsize``, ``kind``, ``name``) is the NumPy
dtype's. ``Tensor.dtype`` returns these, so ``print(x.dtype)`` reads as in torch.

bfloat16 comes from the ``ml_dtypes`` package (NumPy has none): arrays of it work with NumPy's
arithmetic, and autocast may compute in it on the CPU (``autocast("cpu", dtype=bfloat16)``).
``ml_dtypes`` is imported the first time ``bfloat16`` (or ``BFloat16Tensor``) is asked for,
not with minidist: its import takes longer than NumPy's own (half a second with ml_dtypes
0.7), and every rank of every job would pay it. Until then no array can be bfloat16, so the
checks for 16-bit floats (``HALF``) look at the dtype's name and import nothing.

torch's legacy constructors (``torch.LongTensor(data)``, ``FloatTensor``...) are refused with
the modern spelling; they remain usable in ``isinstance`` checks and ``x.type(...)``.
"""

from __future__ import annotations

from typing import Any

import sys

import numpy

from minidist.logger import rank_prefix


class dtype:  # noqa: N801 - torch's name (torch.dtype)
    """A torch-style name for one NumPy dtype: prints as ``minidist.float32``.

    Attributes:
        dtype: the NumPy dtype (NumPy's own protocol: ``numpy.dtype(d)`` reads it).
    """

    __slots__ = ("dtype", "_name")

    def __init__(self, numpy_dtype: Any, name: str) -> None:
        self.dtype = numpy.dtype(numpy_dtype)
        self._name = name

    @property
    def is_floating_point(self) -> bool:
        """True for the float dtypes (bfloat16 included), as torch's ``dtype.is_floating_point``."""
        return self.dtype in HALF or bool(numpy.issubdtype(self.dtype, numpy.floating))

    @property
    def itemsize(self) -> int:
        return int(self.dtype.itemsize)

    def __getattr__(self, name: str) -> Any:  # kind, char, name, type... : the NumPy dtype's
        if name in dtype.__slots__:  # not set yet (only while being built)
            raise AttributeError(name)
        return getattr(self.dtype, name)

    def __repr__(self) -> str:
        return f"minidist.{self._name}"

    __str__ = __repr__

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, dtype):
            return self.dtype == other.dtype
        try:
            return bool(self.dtype == numpy.dtype(other))
        except (TypeError, ValueError):
            return False

    def __hash__(self) -> int:
        return hash(self.dtype)

    def __reduce__(self) -> tuple:  # pickles (and deep-copies) to the same name
        return (wrap, (self.dtype,))


class HalfDtypes:
    """The 16-bit floats, float16 and bfloat16, as a container: ``a.dtype in HALF``.

    A dtype's name decides, so asking imports nothing (a bfloat16 array exists only once
    ``ml_dtypes`` was imported by someone).

    >>> numpy.dtype(numpy.float16) in HALF, numpy.dtype(numpy.float32) in HALF
    (True, False)
    """

    names = ("float16", "bfloat16")

    def __contains__(self, np_dtype: Any) -> bool:
        return isinstance(np_dtype, numpy.dtype) and np_dtype.itemsize == 2 and \
            np_dtype.name in self.names


HALF = HalfDtypes()

# torch's names, canonical first: the canonical one is what repr prints (torch.float -> float32).
# bfloat16 joins when it is first asked for (``__getattr__``).
_NAMES = [
    ("float16", numpy.float16), ("float32", numpy.float32),
    ("float64", numpy.float64), ("uint8", numpy.uint8), ("int8", numpy.int8),
    ("int16", numpy.int16), ("int32", numpy.int32), ("int64", numpy.int64),
    ("bool", numpy.bool_), ("complex64", numpy.complex64), ("complex128", numpy.complex128),
]
_BY_NUMPY: dict[numpy.dtype, dtype] = {numpy.dtype(t): dtype(t, name) for name, t in _NAMES}


def __getattr__(name: str) -> Any:
    """``bfloat16`` and ``BFLOAT16_NUMPY`` (its NumPy dtype), made on first use: the first
    ask imports ``ml_dtypes`` (module docstring); later ones find them as module attributes."""
    if name not in ("bfloat16", "BFLOAT16_NUMPY"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import ml_dtypes

    np_dtype = numpy.dtype(ml_dtypes.bfloat16)
    names = globals()  # this module's attributes: found there from now on
    names["BFLOAT16_NUMPY"] = np_dtype
    names["bfloat16"] = _BY_NUMPY.setdefault(np_dtype, dtype(np_dtype, "bfloat16"))
    return names[name]


def wrap(numpy_dtype: Any) -> dtype:
    """The ``minidist`` dtype for a NumPy dtype (any dtype: others print as NumPy names them)."""
    found = _BY_NUMPY.get(numpy_dtype)
    if found is None:
        np_dtype = numpy.dtype(numpy_dtype)
        found = _BY_NUMPY.setdefault(np_dtype, dtype(np_dtype, np_dtype.name))
    return found


def is_floating(np_dtype: Any) -> bool:
    """True for float16/bfloat16/float32/float64: the dtypes that can carry gradients."""
    return wrap(np_dtype).is_floating_point


float16 = wrap(numpy.float16)
float32 = wrap(numpy.float32)
float64 = wrap(numpy.float64)
uint8 = wrap(numpy.uint8)
int8 = wrap(numpy.int8)
int16 = wrap(numpy.int16)
int32 = wrap(numpy.int32)
int64 = wrap(numpy.int64)
bool_ = wrap(numpy.bool_)

# ---- torch's legacy constructors: refused, with the modern spelling -------------------------

LEGACY_TYPES = {"FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16",
                "BFloat16Tensor": "bfloat16", "ByteTensor": "uint8", "CharTensor": "int8",
                "ShortTensor": "int16", "IntTensor": "int32", "LongTensor": "int64",
                "BoolTensor": "bool_"}
"""Legacy tensor type name -> the name of its dtype here (``x.type()`` answers these names)."""


def legacy_dtype(name: str) -> dtype:
    """The dtype of legacy type ``name`` (``"LongTensor"`` -> ``int64``)."""
    return getattr(sys.modules[__name__], LEGACY_TYPES[name])


def legacy_name(np_dtype: Any) -> str | None:
    """The legacy type name of a NumPy dtype (``int64`` -> ``"LongTensor"``), or None."""
    name = "bool_" if np_dtype == numpy.bool_ else numpy.dtype(np_dtype).name
    return next((k for k, v in LEGACY_TYPES.items() if v == name), None)


class LegacyTensorType(type):
    """The type of ``minidist.LongTensor`` & co: an ``isinstance`` check, not a constructor."""

    @property
    def legacy_dtype(cls) -> dtype:
        return legacy_dtype(cls.__name__)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        dt = cls.legacy_dtype
        raise TypeError(
            f"{rank_prefix()} minidist.{cls.__name__}(...): the legacy constructors "
            f"(torch.{cls.__name__}) are not supported. Use minidist.tensor(data, dtype={dt}) "
            f"for values, or minidist.empty(*size, dtype={dt}) / minidist.zeros(*size, "
            f"dtype={dt}) for a size.")

    def __instancecheck__(cls, obj: Any) -> bool:
        return getattr(obj, "dtype", None) == cls.legacy_dtype and hasattr(obj, "requires_grad")


def legacy_type(name: str) -> LegacyTensorType:
    """The class ``minidist.<name>`` (e.g. ``LongTensor``) for ``isinstance`` and ``.type()``."""
    return LegacyTensorType(name, (), {"__doc__": f"torch.{name}: legacy, refused when called."})


FloatTensor = legacy_type("FloatTensor")
DoubleTensor = legacy_type("DoubleTensor")
HalfTensor = legacy_type("HalfTensor")
BFloat16Tensor = legacy_type("BFloat16Tensor")
ByteTensor = legacy_type("ByteTensor")
CharTensor = legacy_type("CharTensor")
ShortTensor = legacy_type("ShortTensor")
IntTensor = legacy_type("IntTensor")
LongTensor = legacy_type("LongTensor")
BoolTensor = legacy_type("BoolTensor")
