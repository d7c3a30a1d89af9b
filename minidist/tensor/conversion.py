"""A Tensor in another form: another dtype or device, a NumPy array, a Python number, text.

    >>> import numpy
    >>> from minidist.tensor import Tensor
    >>> t = Tensor([1.5, 2.5])
    >>> t.double().dtype, t.long().tolist(), t.to("cpu", numpy.float16).dtype
    (minidist.float64, [1, 2], minidist.float16)
    >>> float(t.sum()), numpy.asarray(t).dtype, f"{t.mean():.2f}"
    (4.0, dtype('float32'), '2.00')

Three groups:

- another dtype or device, on the tape (``astype to cpu cuda float half long int bool double
  bfloat16 type``): ``elementwise.astype`` and ``elementwise.to_device`` do the work, so
  gradients flow back to the original dtype and device;
- leaving minidist (``numpy item tolist`` and Python's hooks ``__array__ __float__ __int__
  __index__ __bool__``): the host copy goes through ``xp.to_host``, which names the call in
  the sync-free checks; ``__array_ufunc__`` decides what NumPy does with ``array + tensor``;
- printing (``__repr__ __format__``): torch's layout, from ``printing``.

As in ``methods``, each is a plain function whose first parameter is the tensor, using its
public surface (``__repr__`` also reads the tape entry's op name, ``_op``, which it prints as
torch prints ``grad_fn``); ``METHODS`` at the bottom is attached to ``Tensor`` by ``core.py``. The
dtype shortcuts are named after the dtype they give (``x.float()`` is ``as_float32(x)``), since
``float``, ``int`` and ``bool`` must keep their builtin meaning in this module.
"""

from __future__ import annotations

from typing import Any

import numpy

from minidist import xp as backend
from minidist.tensor import dtypes, elementwise, printing
from minidist.tensor.core import Tensor, error


def parse_to_args(op: str, args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """``(device or None, dtype or None)`` from torch's ``.to(...)`` spellings.

    Accepted: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(tensor)`` (its device
    and dtype), and the keywords ``device=``, ``dtype=``, ``non_blocking=`` (ignored: copies are
    synchronous), ``copy=`` (ignored).
    """
    kwargs = dict(kwargs)
    kwargs.pop("non_blocking", None)
    kwargs.pop("copy", None)
    where, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    if kwargs:
        raise TypeError(error(op, f"unexpected keyword argument(s) {sorted(kwargs)}; use "
                              "device=, dtype=, non_blocking= or copy=."))
    for arg in args:
        if isinstance(arg, Tensor):
            where, dtype = backend.device_of(arg.array), arg.array.dtype
        elif isinstance(arg, (backend.device, int)) and not isinstance(arg, bool):
            where = arg
        elif isinstance(arg, str) and arg.split(":")[0].strip().lower() in ("cpu", "cuda"):
            where = arg
        elif arg is not None:
            try:
                dtype = numpy.dtype(arg)
            except TypeError:
                raise TypeError(error(op, f"cannot read {arg!r} as a device or a dtype. Pass "
                                      "'cpu', 'cuda:N', minidist.device(...) or a dtype such "
                                      "as numpy.float32.")) from None
    return (None if where is None else backend.device(where),
            None if dtype is None else numpy.dtype(dtype))


# ---- another dtype or device (on the tape) -----------------------------------------------------

def astype(self: Tensor, dtype: Any) -> Tensor:
    return elementwise.astype(self, dtype)


def to(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """torch's ``Tensor.to``: a copy on another device and/or with another dtype.

        t.to("cuda:0"); t.to(numpy.float16); t.to("cpu", numpy.float64); t.to(other)

    Returns self when nothing changes. Differentiable (the gradient flows back to this
    tensor's device and dtype). See ``parse_to_args`` for the accepted spellings.
    """
    where, dtype = parse_to_args("Tensor.to", args, kwargs)
    out = self if where is None else elementwise.to_device(self, where)
    return out if dtype is None else elementwise.astype(out, dtype)


def cpu(self: Tensor) -> Tensor:
    """This tensor on the CPU (self if it is already there)."""
    return elementwise.to_device(self, "cpu")


def cuda(self: Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Tensor:
    """This tensor on GPU ``device`` (default: the current GPU); ``non_blocking`` and torch's
    ``memory_format`` are accepted (copies are synchronous). Without a GPU it raises
    ``DeviceUnavailableError``, as a CPU-only torch raises."""
    return elementwise.to_device(self, backend.device("cuda", device)
                                 if isinstance(device, (int, type(None))) else device)


def as_float32(self: Tensor) -> Tensor:
    return elementwise.astype(self, numpy.float32)


def as_float16(self: Tensor) -> Tensor:
    return elementwise.astype(self, numpy.float16)


def as_int64(self: Tensor) -> Tensor:
    return elementwise.astype(self, numpy.int64)


def as_int32(self: Tensor) -> Tensor:
    return elementwise.astype(self, numpy.int32)


def as_bool(self: Tensor) -> Tensor:
    return elementwise.astype(self, numpy.bool_)


def as_float64(self: Tensor) -> Tensor:
    return elementwise.astype(self, numpy.float64)


def as_bfloat16(self: Tensor) -> Tensor:
    return elementwise.astype(self, dtypes.bfloat16)


def legacy_type(self: Tensor, dtype: Any = None, non_blocking: bool = False) -> Any:
    """``x.type()``. No argument: the legacy type name (``"minidist.FloatTensor"``); a dtype, a
    legacy type (``minidist.LongTensor``) or its name: this tensor cast to it (torch's ``type``)."""
    if dtype is None:
        name = dtypes.legacy_name(self.array.dtype)
        return f"minidist.{name}" if name else f"minidist.{self.array.dtype.name}"
    if isinstance(dtype, str) and dtype.rsplit(".", 1)[-1] in dtypes.LEGACY_TYPES:
        dtype = dtypes.legacy_dtype(dtype.rsplit(".", 1)[-1])
    dtype = getattr(dtype, "legacy_dtype", dtype)
    return elementwise.astype(self, dtype)


# ---- leaving minidist: NumPy and Python values ----------------------------------------------

def item(self: Tensor) -> Any:
    """The value of a one-element tensor as a Python number."""
    if self.array.size != 1:
        raise ValueError(error("item", f"needs a one-element tensor, got shape {self.shape}."
                               " Reduce it first (.sum(), .mean()) or index one element."))
    return backend.to_host(self.array, explicit="item").reshape(()).item()


def to_numpy(self: Tensor) -> numpy.ndarray:
    """``x.numpy()``: the values as a NumPy array (shares memory on the CPU; copies from a GPU)."""
    return backend.to_host(self.array, explicit="numpy")


def tolist(self: Tensor) -> Any:
    """The values as (nested) Python lists of numbers (a number for a 0-d tensor)."""
    return backend.to_host(self.array, explicit="tolist").tolist()


def array_hook(self: Tensor, dtype: Any = None, copy: Any = None) -> numpy.ndarray:
    """``__array__``, NumPy's conversion hook: ``numpy.asarray(t)`` is ``t.numpy()`` (a host copy
    from a GPU), so arrays, ``numpy.stack`` and ``numpy.testing`` take Tensors as torch's do."""
    host = self.numpy()
    return host if dtype is None else host.astype(dtype, copy=False)


def index_hook(self: Tensor) -> int:
    """``__index__``: a one-element integer tensor as an index (``data[i:i + n]``, ``i`` from
    randint)."""
    if self.array.size != 1 or self.array.dtype.kind not in "iu":
        raise TypeError(error("__index__", "only integer tensors of a single element can "
                              f"be converted to an index (this one: dtype {self.dtype}, "
                              f"shape {self.shape})."))
    return int(self.array.reshape(()).item())


def float_hook(self: Tensor) -> float:
    """``__float__``: ``float(t)`` for a one-element tensor."""
    return float(self.item())


def int_hook(self: Tensor) -> int:
    """``__int__``: ``int(t)`` for a one-element tensor."""
    return int(self.item())


def bool_hook(self: Tensor) -> bool:
    """``__bool__``: ``if t:`` for a one-element tensor; any other size is ambiguous."""
    if self.array.size != 1:
        raise RuntimeError(error("bool", f"the truth value of a tensor with {self.array.size}"
                                 " elements is ambiguous. Use .any() / .all() on .array, or "
                                 "compare one element."))
    return bool(backend.to_host(self.array, explicit="bool").reshape(()).item())


REFLECTED_UFUNCS = {
    "add": "__radd__", "subtract": "__rsub__", "multiply": "__rmul__",
    "true_divide": "__rtruediv__", "power": "__rpow__", "matmul": "__rmatmul__",
    "less": "__gt__", "less_equal": "__ge__", "greater": "__lt__", "greater_equal": "__le__",
    "equal": "__eq__", "not_equal": "__ne__"}
"""NumPy ufunc -> the Tensor method that computes ``ndarray <op> tensor`` (the reflected op)."""


def array_ufunc_hook(self: Tensor, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """``__array_ufunc__``: ``ndarray <op> Tensor`` is the Tensor op (a Tensor, as in torch); any
    other NumPy ufunc on a Tensor is refused with the fix (pass ``t.array``, or use the
    method)."""
    reflected = REFLECTED_UFUNCS.get(ufunc.__name__)
    if method == "__call__" and reflected and len(inputs) == 2 and inputs[1] is self:
        if not kwargs:
            return getattr(self, reflected)(inputs[0])
        out = kwargs.get("out")
        if len(kwargs) == 1 and isinstance(out, tuple) and len(out) == 1 \
                and out[0] is inputs[0]:  # array += tensor: the array, updated in place
            return ufunc(inputs[0], self.numpy() if isinstance(out[0], numpy.ndarray)
                         else self.array, out=out)
    raise TypeError(error(
        f"numpy.{ufunc.__name__}", "got a Tensor. .data and .grad are Tensors, as in torch: "
        "use the Tensor method (t.abs(), t.sign(), t.add_(...)) or hand NumPy the array, "
        "t.array (NumPy or CuPy, no copy) or t.numpy()."))


# ---- printing ---------------------------------------------------------------------------------

def repr_hook(self: Tensor) -> str:
    """``__repr__``: torch's layout, ``tensor([0.5000, 0.2500], requires_grad=True)`` (see
    printing)."""
    where = str(self.device) if self.is_cuda else None
    host = backend.to_host(self.array, explicit="print")
    return printing.tensor_repr(host, where, self.requires_grad,
                                None if self.is_leaf else self._op)


def format_hook(self: Tensor, format_spec: str) -> str:
    """``__format__``, torch's rule: a 0-d tensor formats as its number (``f"{loss:.4f}"``); any
    other takes only the empty spec (``f"{t}"`` is ``str(t)``)."""
    if self.array.ndim == 0:
        return format(self.item(), format_spec)
    return object.__format__(self, format_spec)


# The method name -> the function; core.py attaches these to Tensor.
METHODS: dict[str, Any] = {
    "astype": astype, "to": to, "cpu": cpu, "cuda": cuda, "float": as_float32,
    "half": as_float16, "long": as_int64, "int": as_int32, "bool": as_bool,
    "double": as_float64, "bfloat16": as_bfloat16, "type": legacy_type,
    "item": item, "numpy": to_numpy, "tolist": tolist, "__array__": array_hook,
    "__index__": index_hook, "__float__": float_hook, "__int__": int_hook,
    "__bool__": bool_hook, "__array_ufunc__": array_ufunc_hook,
    "__repr__": repr_hook, "__format__": format_hook,
}
