"""Tensor: an xp array (NumPy or CuPy) plus the tape entry that says how it was computed.

    from minidist.tensor import Tensor
    w = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)    # float32 by default
    loss = (w @ w.T).relu().sum()
    loss.backward()
    w.grad                                                      # a Tensor (its .array: NumPy)
    w.array                                                     # the backend array, no copy

Each op (in ``elementwise``, ``reduce``, ``shape``, ``linalg``, ``functional``, ``conv``) computes
its result on ``.array`` and, when grad mode is on and an input requires grad, records a node:
the inputs (``_parents``) and a ``_backward(g)`` closure that maps the output's gradient to one
gradient per input. ``autograd.run_backward`` walks those nodes; see docs/tensor.md.

This file holds what a Tensor IS: its array, its tape entry, its gradient, its shape, and
Python's operators (``a + b``, ``a @ b``, ``a == b``, ``x[i]``). torch's named methods are plain
functions in ``methods`` (x.relu(), x.sum(dim=1), x.view(-1, 4)), ``inplace_methods`` (x.add_(y),
x.zero_()), ``conversion`` (x.float(), x.to("cuda"), x.item()) and others; each module ends with
a ``METHODS`` table that the bottom of this file attaches to the class in one visible place
(``Tensor.sum is methods.sum``): no base classes reaching into this one.

``.data`` and ``.grad`` are Tensors, as in torch: ``w.data`` is a detached Tensor sharing
``w``'s array (``w.data.normal_()`` initialises ``w``), ``w.grad`` a Tensor whose array is the
gradient (for DDP: a view into its bucket). The array itself is ``.array`` (NumPy or CuPy, no
copy; the library's own code works on it) and, on the host, ``.numpy()``.

Dtypes: Python floats and lists become float32; arrays keep their dtype (float16, float32,
float64 are carried through every op, Python scalars never upcast them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy

from minidist import xp as backend
from minidist.logger import rank_prefix
from minidist.tensor import dtypes
from minidist.tensor.grad_mode import is_grad_enabled

BackwardFn = Callable[[Any], Sequence[Any]]


def error(op: str, message: str) -> str:
    """Format an error message the project's way: ``[rank R/N] op: message``."""
    return f"{rank_prefix()} {op}: {message}"


def is_floating(dtype: Any) -> bool:
    """True for float16/bfloat16/float32/float64 (the dtypes that can carry gradients)."""
    return dtypes.is_floating(dtype)


def as_array(data: Any, dtype: Any = None) -> Any:
    """An xp array for ``data``: arrays are kept (no copy), Python floats/lists become float32."""
    if isinstance(data, Tensor):
        data = data.array
    if isinstance(data, numpy.ndarray) or backend.is_device_array(data):
        return data if dtype is None else data.astype(dtype, copy=False)
    if isinstance(data, numpy.generic):
        return numpy.asarray(data, dtype=dtype)
    arr = backend.default_array_module().asarray(data, dtype=dtype)
    if dtype is None and arr.dtype == numpy.float64:
        arr = arr.astype(numpy.float32)  # Python floats: float32, as torch's default dtype
    return arr


class Tensor:
    """An n-dimensional array that records the ops applied to it, for reverse-mode autograd.

    Args:
        data: an xp array (kept without a copy), a Python scalar or nested list (float32, or
            int64 for ints), a NumPy scalar, or another Tensor (shares its data).
        requires_grad: make this a leaf whose ``.grad`` backward fills in (float dtypes only).
        dtype: convert to this dtype first (a NumPy dtype or its name).

    Attributes:
        array: the backend array holding the values (NumPy on the CPU, CuPy on a GPU; no copy).
        requires_grad: whether gradients flow to (leaf) or through (op result) this tensor.
    """

    __slots__ = ("array", "_grad", "_grad_view", "requires_grad", "_parents", "_backward", "_op",
                 "_hooks", "_grad_dest", "__weakref__")
    if TYPE_CHECKING:  # to a type checker: the methods the METHODS tables attach (see above)
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None) -> None:
        self.array = as_array(data, dtype)
        self._grad: Any = None  # the gradient's array; ``grad`` hands out a Tensor over it
        self._grad_view: Tensor | None = None
        self._parents: tuple[Tensor, ...] = ()
        self._backward: BackwardFn | None = None
        self._op = ""
        self._hooks: dict[int, Callable[[Tensor], None]] | None = None
        self._grad_dest: Any = None  # grad_destination.GradDestination or None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    # ---- tape -----------------------------------------------------------------------------

    @staticmethod
    def _make(data: Any, parents: tuple[Tensor, ...], backward: BackwardFn, op: str) -> Tensor:
        """The result of an op: records ``(parents, backward)`` when the tape is on.

        NumPy answers arithmetic on 0-d arrays with a read-only scalar (``numpy.float32``);
        it is wrapped back into a writable 0-d array, so a 0-d accumulator (``correct +=
        ...``) can still be all-reduced in place."""
        if isinstance(data, numpy.generic):
            data = numpy.asarray(data)
        out = Tensor.__new__(Tensor)
        out.array, out._grad, out._op, out._hooks, out._grad_dest = data, None, op, None, None
        out._grad_view = None
        if is_grad_enabled() and any(p.requires_grad for p in parents):
            out.requires_grad, out._parents, out._backward = True, parents, backward
        else:
            out.requires_grad, out._parents, out._backward = False, (), None
        return out

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The tensors this one was computed from, as recorded on the tape (``()`` for a leaf,
        or once backward has freed the graph). DDP walks them to find unused parameters."""
        return self._parents

    @property
    def is_leaf(self) -> bool:
        """True for tensors made by the user (not by an op recorded on the tape)."""
        return self._backward is None

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set ``requires_grad`` on a leaf, in place; returns self."""
        if not self.is_leaf:
            raise RuntimeError(error("requires_grad_", "only leaf tensors can change "
                                     "requires_grad. Use .detach() to get a new leaf."))
        if requires_grad and not is_floating(self.array.dtype):
            raise TypeError(error("requires_grad_", f"only float tensors can require grad, got "
                                  f"dtype {self.array.dtype}. Convert with .float() first."))
        self.requires_grad = bool(requires_grad)
        return self

    @staticmethod
    def _wrap(array: Any) -> Tensor:
        """A leaf over ``array`` as it is (no checks, no copy): ``.data`` and ``.grad``."""
        out = Tensor.__new__(Tensor)
        out.array, out._grad, out._grad_view, out._op, out._hooks = array, None, None, "", None
        out._grad_dest, out.requires_grad, out._parents, out._backward = None, False, (), None
        return out

    @property
    def data(self) -> Tensor:
        """torch's ``.data``: a new leaf sharing this tensor's array, outside the tape.

        Writes through it change this tensor without the tape seeing them, as in torch:
        ``p.data.normal_(0, 0.02)``, ``p.data.add_(p.grad, alpha=-lr)``. ``p.data = t`` makes
        ``p`` hold ``t``'s array (shape and dtype may change). The array itself: ``.array``.
        """
        return Tensor._wrap(self.array)

    @data.setter
    def data(self, value: Any) -> None:
        if isinstance(value, Tensor):
            value = value.array
        elif not (isinstance(value, numpy.ndarray) or backend.is_device_array(value)):
            raise TypeError(error("data", f"assigned a {type(value).__name__}; assign a Tensor "
                                  "(p.data = t, as torch) or a NumPy/CuPy array."))
        self.array = value

    @property
    def grad(self) -> Tensor | None:
        """The accumulated gradient, a Tensor over the gradient array, or None.

        ``backward`` adds into that array IN PLACE and never rebinds it, so it may be a view into
        a larger buffer (DDP buckets: ``p.grad.array`` is that view, no copy); its dtype may
        differ from the tensor's (cast on add). The same Tensor comes back while the array is
        the same (a ``grad_destination``'s buffer: its Tensor, the same object every step);
        ``p.grad.data = t`` (torch's way to swap the storage) is kept.
        """
        g = self._grad
        if g is None:
            return None
        view = self._grad_view
        if view is None:
            view = self._grad_view = Tensor._wrap(g)
        elif view.array is not g:  # rebound through the Tensor (p.grad.data = t): adopt it
            self._grad = view.array
        return view

    @grad.setter
    def grad(self, value: Any) -> None:
        if isinstance(value, Tensor):
            value = value.array
        if value is not None and tuple(value.shape) != self.array.shape:
            raise ValueError(error("grad", f"assigned a gradient of shape {tuple(value.shape)} to "
                                   f"a tensor of shape {self.array.shape}. Shapes must match."))
        self._grad, self._grad_view = value, None

    def backward(self, gradient: Any = None, retain_graph: bool = False) -> None:
        """Backpropagate from this tensor; see ``autograd.run_backward``."""
        autograd.run_backward(self, gradient, retain_graph)

    def register_post_accumulate_grad_hook(self, hook: Callable[[Tensor], None]) -> Any:
        """Call ``hook(self)`` right after this leaf's grad is complete, once per backward
        (``autograd.register_post_accumulate_grad_hook``); returns a handle with ``.remove()``."""
        return autograd.register_post_accumulate_grad_hook(self, hook)

    def detach(self) -> Tensor:
        """A new leaf sharing this tensor's data, outside the tape."""
        return Tensor(self.array)

    # ---- array properties ----------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> dtypes.dtype:
        """The dtype, torch-style: ``minidist.float32`` (equal to ``numpy.float32``)."""
        return dtypes.wrap(self.array.dtype)

    @property
    def ndim(self) -> int:
        return int(self.array.ndim)

    @property
    def device(self) -> backend.device:
        """Where the data lives: ``device(type='cpu')`` or ``device(type='cuda', index=N)``."""
        return backend.device_of(self.array)

    # ---- Python's operators (their ops, with the backward, in elementwise, linalg, shape) ----

    def __add__(self, other: Any) -> Tensor:
        return elementwise.add(self, other)

    __radd__ = __add__  # other + self

    def __sub__(self, other: Any) -> Tensor:
        return elementwise.sub(self, other)

    def __rsub__(self, other: Any) -> Tensor:  # other - self
        return elementwise.rsub(self, other)

    def __mul__(self, other: Any) -> Tensor:
        return elementwise.mul(self, other)

    __rmul__ = __mul__  # other * self

    def __truediv__(self, other: Any) -> Tensor:
        return elementwise.div(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:  # other / self
        return elementwise.rdiv(self, other)

    def __neg__(self) -> Tensor:
        return elementwise.neg(self)

    def __pow__(self, exponent: Any) -> Tensor:
        return elementwise.pow(self, exponent)

    def __matmul__(self, other: Any) -> Tensor:
        return linalg.matmul(self, other)

    # ``==`` is elementwise, as torch; hashing stays by identity, so tensors can key dicts and
    # sets (lookups compare by ``is`` first). ``in`` on a list of tensors calls ``==``: avoid.

    def __eq__(self, other: Any) -> Tensor:  # type: ignore[override]
        return elementwise.compare("eq", self, other)

    def __hash__(self) -> int:
        return id(self)

    def __getitem__(self, index: Any) -> Tensor:
        return shape_ops.getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        """``x[mask] = -inf``: in place, outside the tape (see ``shape.setitem``)."""
        shape_ops.setitem(self, index, value)


def attach_methods(cls: type, *tables: dict[str, Any]) -> None:
    """Make each ``name: function`` (or property) of ``tables`` an attribute of ``cls``."""
    for table in tables:
        for name, function in table.items():
            assert name not in vars(cls), f"{cls.__name__}.{name} is defined twice"
            setattr(cls, name, function)


# ---- the rest of Tensor's methods, attached in one place ---------------------------------------
# The op modules import Tensor from here, so they (and the method modules, which call them)
# are imported after the class exists. Each method module ends with its METHODS table.
from minidist.tensor import (autograd, conversion, elementwise, grad_destination,  # noqa: E402
                             inplace_methods, linalg, methods, more_methods, compat_methods,
                             torch_methods)
from minidist.tensor import shape as shape_ops  # noqa: E402

attach_methods(Tensor, grad_destination.METHODS, methods.METHODS, inplace_methods.METHODS,
               conversion.METHODS, torch_methods.METHODS, more_methods.METHODS,
               compat_methods.METHODS)
