"""Tensor: an xp array (NumPy or CuPy) plus the tape entry that says how it was computed.

    from minidist.tensor import Tensor
    w = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)    # float32 by default
    loss = (w @ w.T).relu().sum()
    loss.backward()
    w.grad                                                      # an xp array, like w.data

Each op (in ``elementwise``, ``reduce``, ``shape``, ``linalg``, ``functional``, ``conv``) computes
its result on ``.data`` and, when grad mode is on and an input requires grad, records a node:
the inputs (``_parents``) and a ``_backward(g)`` closure that maps the output's gradient to one
gradient per input. ``autograd.run_backward`` walks those nodes; see docs/tensor.md.

Dtypes: Python floats and lists become float32; arrays keep their dtype (float16, float32,
float64 are carried through every op; Python scalars never upcast them).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

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
            where, dtype = backend.device_of(arg.data), arg.data.dtype
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


class ElementCount(int):
    """``Tensor.size``: an int (the element count) that torch code can call: ``x.size(1)``."""

    def __new__(cls, numel: int, shape: tuple[int, ...]) -> ElementCount:
        obj = super().__new__(cls, numel)
        obj.shape = shape
        return obj

    def __call__(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]


def _axis(axis: Any, dim: Any) -> Any:
    """NumPy's ``axis`` or torch's ``dim`` (at most one of them)."""
    if axis is not None and dim is not None:
        raise TypeError(error("reduce", f"got both axis={axis!r} and dim={dim!r}; pass one."))
    return dim if dim is not None else axis


def as_array(data: Any, dtype: Any = None) -> Any:
    """An xp array for ``data``: arrays are kept (no copy), Python floats/lists become float32."""
    if isinstance(data, Tensor):
        data = data.data
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
        data: the xp array holding the values.
        requires_grad: whether gradients flow to (leaf) or through (op result) this tensor.
    """

    __slots__ = ("data", "_grad", "requires_grad", "_parents", "_backward", "_op", "_hooks",
                 "_grad_dest", "__weakref__")
    __array_ufunc__ = None  # ndarray <op> Tensor -> Tensor.__r<op>__, not an object array

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None) -> None:
        self.data = as_array(data, dtype)
        self._grad: Any = None
        self._parents: tuple[Tensor, ...] = ()
        self._backward: BackwardFn | None = None
        self._op = ""
        self._hooks: dict[int, Callable[[Tensor], None]] | None = None
        self._grad_dest: Any = None  # autograd.GradDestination or None
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
        out.data, out._grad, out._op, out._hooks, out._grad_dest = data, None, op, None, None
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
        if requires_grad and not is_floating(self.data.dtype):
            raise TypeError(error("requires_grad_", f"only float tensors can require grad, got "
                                  f"dtype {self.data.dtype}. Convert with .float() first."))
        self.requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self) -> Any:
        """The accumulated gradient (an xp array of this shape) or None.

        ``backward`` adds into this array IN PLACE and never rebinds it, so it may be a view into
        a larger buffer (DDP buckets); its dtype may differ from the tensor's (cast on add).
        """
        return self._grad

    @grad.setter
    def grad(self, value: Any) -> None:
        if isinstance(value, Tensor):
            value = value.data
        if value is not None and tuple(value.shape) != self.data.shape:
            raise ValueError(error("grad", f"assigned a gradient of shape {tuple(value.shape)} to "
                                   f"a tensor of shape {self.data.shape}. Shapes must match."))
        self._grad = value

    @property
    def grad_destination(self) -> Any:
        """The buffer reserved for this leaf's gradient (``autograd.GradDestination``) or None.

        While ``.grad`` is None, backward writes the gradient straight into the reserved
        buffer (times its ``scale``) and makes that buffer ``.grad``, instead of allocating a
        new array: ``zero_grad(set_to_none=True)`` then costs nothing, and the next backward
        fills the same memory again. DDP reserves each parameter's slot of its gradient bucket
        (see docs/tensor.md, "Gradient destinations"). Assign None to release it.
        """
        return self._grad_dest

    @grad_destination.setter
    def grad_destination(self, dest: Any) -> None:
        if dest is not None:
            if not isinstance(dest, autograd.GradDestination):
                raise TypeError(error("grad_destination", f"expected a GradDestination or None, "
                                      f"got {type(dest).__name__}. Wrap the buffer: "
                                      "GradDestination(buffer, scale=1.0)."))
            if not self.is_leaf or not self.requires_grad:
                raise RuntimeError(error(
                    "grad_destination", "only a leaf that requires grad has a gradient to "
                    f"write (this one: requires_grad={self.requires_grad}, "
                    f"is_leaf={self.is_leaf}). Reserve it on the parameter itself."))
            if tuple(dest.buffer.shape) != self.data.shape:
                raise ValueError(error(
                    "grad_destination", f"buffer of shape {tuple(dest.buffer.shape)} for a tensor "
                    f"of shape {self.data.shape}. Reshape the buffer to the tensor's shape."))
        self._grad_dest = dest

    def backward(self, gradient: Any = None, retain_graph: bool = False) -> None:
        """Backpropagate from this tensor; see ``autograd.run_backward``."""
        autograd.run_backward(self, gradient, retain_graph)

    def register_post_accumulate_grad_hook(self, hook: Callable[[Tensor], None]) -> Any:
        """Call ``hook(self)`` once per backward, right after this leaf's grad is complete.

        See ``autograd.register_post_accumulate_grad_hook``. Returns a handle with ``.remove()``.
        """
        return autograd.register_post_accumulate_grad_hook(self, hook)

    def detach(self) -> Tensor:
        """A new leaf sharing this tensor's data, outside the tape."""
        return Tensor(self.data)

    # ---- array properties ----------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> dtypes.dtype:
        """The dtype, torch-style: ``minidist.float32`` (equal to ``numpy.float32``)."""
        return dtypes.wrap(self.data.dtype)

    @property
    def ndim(self) -> int:
        return int(self.data.ndim)

    @property
    def size(self) -> ElementCount:
        """Number of elements (NumPy's ``x.size``), also callable as torch's ``x.size(dim)``.

        ``x.size`` is an int (the element count); ``x.size()`` is the shape tuple and
        ``x.size(1)`` the length of dim 1, as in torch.
        """
        return ElementCount(int(self.data.size), tuple(self.data.shape))

    def dim(self) -> int:
        """Number of dims (torch's name for ``ndim``)."""
        return int(self.data.ndim)

    def numel(self) -> int:
        return int(self.data.size)

    def __len__(self) -> int:
        if self.data.ndim == 0:
            raise TypeError(error("len", "len() of a 0-d tensor. Use .item()."))
        return int(self.data.shape[0])

    def item(self) -> float:
        """The value of a one-element tensor as a Python number."""
        if self.data.size != 1:
            raise ValueError(error("item", f"needs a one-element tensor, got shape {self.shape}."
                                   " Reduce it first (.sum(), .mean()) or index one element."))
        return backend.to_host(self.data, explicit="item").reshape(()).item()

    def numpy(self) -> numpy.ndarray:
        """The values as a NumPy array (shares memory on the CPU; copies from a GPU)."""
        return backend.to_host(self.data, explicit="numpy")

    def tolist(self) -> Any:
        """The values as (nested) Python lists of numbers (a number for a 0-d tensor)."""
        return backend.to_host(self.data, explicit="tolist").tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> numpy.ndarray:
        """NumPy's conversion hook: ``numpy.asarray(t)`` is ``t.numpy()`` (a host copy from a
        GPU), so arrays, ``numpy.stack`` and ``numpy.testing`` take Tensors as torch's do."""
        host = self.numpy()
        return host if dtype is None else host.astype(dtype, copy=False)

    def __index__(self) -> int:
        """A one-element integer tensor as an index (``data[i:i + n]``, ``i`` from randint)."""
        if self.data.size != 1 or self.data.dtype.kind not in "iu":
            raise TypeError(error("__index__", "only integer tensors of a single element can "
                                  f"be converted to an index (this one: dtype {self.dtype}, "
                                  f"shape {self.shape})."))
        return int(self.data.reshape(()).item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __repr__(self) -> str:
        """torch's layout, ``tensor([0.5000, 0.2500], requires_grad=True)`` (see printing)."""
        where = str(self.device) if self.is_cuda else None
        host = backend.to_host(self.data, explicit="print")
        return printing.tensor_repr(host, where, self.requires_grad,
                                    None if self.is_leaf else self._op)

    def __format__(self, format_spec: str) -> str:
        """torch's rule: a 0-d tensor formats as its number (``f"{loss:.4f}"``); any other
        takes only the empty spec (``f"{t}"`` is ``str(t)``)."""
        if self.data.ndim == 0:
            return format(self.item(), format_spec)
        return object.__format__(self, format_spec)

    # ---- ops (each is implemented, with its backward, in the module named) ------------------

    def astype(self, dtype: Any) -> Tensor:
        return elementwise.astype(self, dtype)

    @property
    def device(self) -> backend.device:
        """Where the data lives: ``device(type='cpu')`` or ``device(type='cuda', index=N)``."""
        return backend.device_of(self.data)

    @property
    def is_cuda(self) -> bool:
        return backend.is_device_array(self.data)

    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        """torch's ``Tensor.to``: a copy on another device and/or with another dtype.

            t.to("cuda:0"); t.to(numpy.float16); t.to("cpu", numpy.float64); t.to(other)

        Returns self when nothing changes. Differentiable (the gradient flows back to this
        tensor's device and dtype). See ``parse_to_args`` for the accepted spellings.
        """
        where, dtype = parse_to_args("Tensor.to", args, kwargs)
        out = self if where is None else elementwise.to_device(self, where)
        return out if dtype is None else elementwise.astype(out, dtype)

    def cpu(self) -> Tensor:
        """This tensor on the CPU (self if it is already there)."""
        return elementwise.to_device(self, "cpu")

    def cuda(self, device: Any = None) -> Tensor:
        """This tensor on GPU ``device`` (default: the current GPU)."""
        return elementwise.to_device(self, backend.device("cuda", device)
                                     if isinstance(device, (int, type(None))) else device)

    def float(self) -> Tensor:
        return elementwise.astype(self, numpy.float32)

    def half(self) -> Tensor:
        return elementwise.astype(self, numpy.float16)

    def long(self) -> Tensor:
        return elementwise.astype(self, numpy.int64)

    def int(self) -> Tensor:
        return elementwise.astype(self, numpy.int32)

    def bool(self) -> Tensor:
        return elementwise.astype(self, numpy.bool_)

    def double(self) -> Tensor:
        return elementwise.astype(self, numpy.float64)

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

    def __rpow__(self, base: Any) -> Tensor:  # base ** self
        return elementwise.rpow(self, base)

    def __matmul__(self, other: Any) -> Tensor:
        return linalg.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:  # other @ self
        return linalg.matmul(Tensor(other), self)

    def exp(self) -> Tensor:
        return elementwise.exp(self)

    def log(self) -> Tensor:
        return elementwise.log(self)

    def tanh(self) -> Tensor:
        return elementwise.tanh(self)

    def sigmoid(self) -> Tensor:
        return elementwise.sigmoid(self)

    def relu(self) -> Tensor:
        return elementwise.relu(self)

    def gelu(self, approximate: str = "none") -> Tensor:
        return elementwise.gelu(self, approximate)

    # Reductions take NumPy's ``axis=``/``keepdims=`` and torch's ``dim=``/``keepdim=``; the
    # first positional argument means the same in both.

    def sum(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
            keepdim: bool = False) -> Tensor:
        return reduce.sum(self, _axis(axis, dim), keepdims or keepdim)

    def mean(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None,
             keepdim: bool = False) -> Tensor:
        return reduce.mean(self, _axis(axis, dim), keepdims or keepdim)

    def max(self, dim: int | None = None, keepdim: bool = False, *, axis: int | None = None,
            keepdims: bool = False) -> Any:
        """torch's spelling ``x.max(dim)`` returns ``(values, indices)``; NumPy's
        ``x.max(axis=1)`` and ``x.max()`` return the values only (a Tensor)."""
        if dim is not None:
            return reduce.max_dim(self, dim, keepdim or keepdims)
        return reduce.max(self, axis, keepdims or keepdim)

    def min(self, dim: int | None = None, keepdim: bool = False, *, axis: int | None = None,
            keepdims: bool = False) -> Any:
        """Like ``max``: ``x.min(dim)`` gives ``(values, indices)``, ``x.min(axis=1)`` values."""
        if dim is not None:
            return reduce.min_dim(self, dim, keepdim or keepdims)
        return reduce.min(self, axis, keepdims or keepdim)

    def argmax(self, dim: int | None = None, keepdim: bool = False, *,
               axis: int | None = None) -> Tensor:
        """Indices of the maxima (an int64 tensor, outside the tape)."""
        return reduce.argmax(self, _axis(axis, dim), keepdim)

    def argmin(self, dim: int | None = None, keepdim: bool = False, *,
               axis: int | None = None) -> Tensor:
        """Indices of the minima (an int64 tensor, outside the tape)."""
        return reduce.argmin(self, _axis(axis, dim), keepdim)

    def reshape(self, *shape: Any) -> Tensor:
        return shape_ops.reshape(self, *shape)

    def view(self, *shape: Any) -> Tensor:
        """torch's ``view``: ``reshape`` (NumPy returns a view whenever the layout allows)."""
        return shape_ops.reshape(self, *shape)

    def view_as(self, other: Tensor) -> Tensor:
        return shape_ops.reshape(self, other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        return shape_ops.flatten(self, start_dim, end_dim)

    def unsqueeze(self, dim: int) -> Tensor:
        return shape_ops.unsqueeze(self, dim)

    def squeeze(self, dim: Any = None) -> Tensor:
        return shape_ops.squeeze(self, dim)

    def clone(self) -> Tensor:
        """A copy of the data that stays on the tape (torch's ``clone``)."""
        return elementwise.clone(self)

    # ---- comparisons: bool tensors, outside the tape (``pred.eq(y).sum().item()``) ------------

    def eq(self, other: Any) -> Tensor:
        return elementwise.compare("eq", self, other)

    def ne(self, other: Any) -> Tensor:
        return elementwise.compare("ne", self, other)

    # ``==``/``!=`` are elementwise, as torch; hashing stays by identity, so tensors can key
    # dicts and sets (whose lookups compare by ``is`` first and only call ``==`` on equal
    # hashes, which distinct live tensors never have). Never use ``in`` on a list of tensors or
    # ``list.index``: they call ``==``. Weak maps keyed by tensors: ``WeakIdKeyDictionary``.

    def __eq__(self, other: Any) -> Tensor:  # type: ignore[override]
        return elementwise.compare("eq", self, other)

    def __ne__(self, other: Any) -> Tensor:  # type: ignore[override]
        return elementwise.compare("ne", self, other)

    def __hash__(self) -> int:
        return id(self)

    def __lt__(self, other: Any) -> Tensor:
        return elementwise.compare("lt", self, other)

    def __le__(self, other: Any) -> Tensor:
        return elementwise.compare("le", self, other)

    def __gt__(self, other: Any) -> Tensor:
        return elementwise.compare("gt", self, other)

    def __ge__(self, other: Any) -> Tensor:
        return elementwise.compare("ge", self, other)

    def __bool__(self) -> bool:
        if self.data.size != 1:
            raise RuntimeError(error("bool", f"the truth value of a tensor with {self.data.size}"
                                     " elements is ambiguous. Use .any() / .all() on .data, or "
                                     "compare one element."))
        return bool(backend.to_host(self.data, explicit="bool").reshape(()).item())

    # ---- in-place fills, torch's initialisers (outside the tape, like nn.init) --------------

    def zero_(self) -> Tensor:
        self.data[...] = 0
        return self

    def fill_(self, value: Any) -> Tensor:
        self.data[...] = value.item() if isinstance(value, Tensor) else value
        return self

    def normal_(self, mean: float = 0.0, std: float = 1.0) -> Tensor:
        """Fill with N(mean, std^2) draws from the ``manual_seed`` generator; returns self."""
        host = random.default_generator().normal(mean, std, size=self.shape)
        return self._fill_host(host)

    def uniform_(self, a: float = 0.0, b: float = 1.0) -> Tensor:
        """Fill with U(a, b) draws from the ``manual_seed`` generator; returns self."""
        return self._fill_host(random.default_generator().uniform(a, b, size=self.shape))

    def copy_(self, src: Any) -> Tensor:
        """Copy ``src``'s values into this tensor's array (cast, broadcast); returns self."""
        value = src.data if isinstance(src, Tensor) else src
        xp = backend.get_array_module(self.data)
        self.data[...] = xp.asarray(backend.move(value, self.device)).astype(self.data.dtype)
        return self

    def _fill_host(self, host: numpy.ndarray) -> Tensor:
        xp = backend.get_array_module(self.data)
        self.data[...] = xp.asarray(host.astype(self.data.dtype))
        return self

    def transpose(self, *axes: Any) -> Tensor:
        """torch's ``transpose(dim0, dim1)`` (two ints: swap those dims, any rank), or NumPy's
        ``transpose(*axes)`` (a full permutation; none: reverse the dims, like ``.T``)."""
        if len(axes) == 2 and all(isinstance(a, int) for a in axes):
            return shape_ops.swapaxes(self, *axes)
        return shape_ops.transpose(self, *axes)

    def permute(self, *dims: Any) -> Tensor:
        """Reorder all dims (``x.permute(0, 2, 1, 3)``)."""
        return shape_ops.transpose(self, *dims)

    @property
    def T(self) -> Tensor:  # noqa: N802 - NumPy/torch name
        return shape_ops.transpose(self)

    def __getitem__(self, index: Any) -> Tensor:
        return shape_ops.getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        """``x[mask] = -inf``: in place, outside the tape (see ``shape.setitem``)."""
        shape_ops.setitem(self, index, value)

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
        """``(values, indices)`` of the ``k`` largest entries along ``dim`` (torch's topk)."""
        return reduce.topk(self, k, dim, largest, sorted)

    def multinomial(self, num_samples: int, replacement: bool = False,
                    generator: Any = None) -> Tensor:
        return creation.multinomial(self, num_samples, replacement, generator)

    def softmax(self, dim: int | None = -1, *, axis: int | None = None) -> Tensor:
        return functional.softmax(self, dim, axis=axis)

    def log_softmax(self, dim: int | None = -1, *, axis: int | None = None) -> Tensor:
        return functional.log_softmax(self, dim, axis=axis)

    def masked_fill(self, mask: Any, value: Any) -> Tensor:
        """``value`` where the bool ``mask`` is True (broadcast), this tensor elsewhere."""
        return elementwise.masked_fill(self, mask, value)

    def tril(self, diagonal: int = 0) -> Tensor:
        return shape_ops.tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        return shape_ops.triu(self, diagonal)

    def split(self, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
        return shape_ops.split(self, split_size_or_sections, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        return shape_ops.chunk(self, chunks, dim)

    def contiguous(self) -> Tensor:
        """Self: layouts are NumPy's business here (ops copy when they need to)."""
        return self

    # ---- torch's in-place arithmetic (inplace.py: torch's autograd rules for in-place ops) ---

    def add_(self, other: Any, *, alpha: Any = 1) -> Tensor:
        return inplace.add_(self, other, alpha)

    def sub_(self, other: Any, *, alpha: Any = 1) -> Tensor:
        return inplace.sub_(self, other, alpha)

    def mul_(self, other: Any) -> Tensor:
        return inplace.mul_(self, other)

    def div_(self, other: Any) -> Tensor:
        return inplace.div_(self, other)

    def pow_(self, exponent: Any) -> Tensor:
        return inplace.pow_(self, exponent)

    def clamp_(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
        return inplace.clamp_(self, min, max)

    def addcmul_(self, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
        return inplace.addcmul_(self, tensor1, tensor2, value)

    def addcdiv_(self, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
        return inplace.addcdiv_(self, tensor1, tensor2, value)

    # ---- torch's method spellings of the ops (out-of-place, on the tape) -------------------

    def add(self, other: Any, *, alpha: Any = 1) -> Tensor:
        return elementwise.add(self, other if alpha == 1 else other * alpha)

    def sub(self, other: Any, *, alpha: Any = 1) -> Tensor:
        return elementwise.sub(self, other if alpha == 1 else other * alpha)

    def mul(self, other: Any) -> Tensor:
        return elementwise.mul(self, other)

    def div(self, other: Any) -> Tensor:
        return elementwise.div(self, other)

    def pow(self, exponent: Any) -> Tensor:
        return elementwise.pow(self, exponent)

    def addcmul(self, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
        return self + tensor1 * tensor2 * value

    def addcdiv(self, tensor1: Any, tensor2: Any, *, value: Any = 1) -> Tensor:
        return self + tensor1 / tensor2 * value

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
        return mathops.clamp(self, min, max)

    clip = clamp

    def sqrt(self) -> Tensor:
        return mathops.sqrt(self)

    def abs(self) -> Tensor:
        return mathops.abs(self)

    def sin(self) -> Tensor:
        return mathops.sin(self)

    def cos(self) -> Tensor:
        return mathops.cos(self)

    def norm(self, p: Any = "fro", dim: Any = None, keepdim: bool = False,
             dtype: Any = None) -> Tensor:
        return mathops.norm(self, p, dim, keepdim, dtype)

    def where(self, condition: Any, other: Any) -> Tensor:
        """torch's method form: ``self`` where ``condition``, ``other`` elsewhere."""
        return mathops.where(condition, self, other)

    def trace(self) -> Tensor:
        return mathops.trace(self)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        return views.diagonal(self, offset, dim1, dim2)

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        return views.narrow(self, dim, start, length)

    def expand(self, *sizes: Any) -> Tensor:
        return views.expand(self, *sizes)

    def expand_as(self, other: Any) -> Tensor:
        return views.expand_as(self, other)

    def t(self) -> Tensor:
        return views.t(self)

    # ---- new tensors like this one (torch's new_*: this dtype and device by default) ---------

    def _defaults(self, dtype: Any, device: Any, requires_grad: bool) -> dict:
        return {"dtype": self.data.dtype if dtype is None else dtype,
                "device": self.device if device is None else device,
                "requires_grad": requires_grad}

    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None,
                  requires_grad: bool = False) -> Tensor:
        return creation.zeros(*size, **self._defaults(dtype, device, requires_grad))

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None,
                 requires_grad: bool = False) -> Tensor:
        return creation.ones(*size, **self._defaults(dtype, device, requires_grad))

    def new_empty(self, *size: Any, dtype: Any = None, device: Any = None,
                  requires_grad: bool = False) -> Tensor:
        return creation.empty(*size, **self._defaults(dtype, device, requires_grad))

    def new_full(self, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None,
                 requires_grad: bool = False) -> Tensor:
        return creation.full(size, fill_value, **self._defaults(dtype, device, requires_grad))

    def new_tensor(self, data: Any, *, dtype: Any = None, device: Any = None,
                   requires_grad: bool = False) -> Tensor:
        return creation.tensor(data, **self._defaults(dtype, device, requires_grad))

    def type(self, dtype: Any = None, non_blocking: bool = False) -> Any:
        """No argument: the legacy type name (``"minidist.FloatTensor"``); a dtype, a legacy
        type (``minidist.LongTensor``) or its name: this tensor cast to it (torch's ``type``)."""
        if dtype is None:
            name = next((n for n, d in dtypes.LEGACY_TYPES.items() if d == self.data.dtype),
                        None)
            return f"minidist.{name}" if name else f"minidist.{self.data.dtype.name}"
        if isinstance(dtype, str) and dtype.rsplit(".", 1)[-1] in dtypes.LEGACY_TYPES:
            dtype = dtypes.LEGACY_TYPES[dtype.rsplit(".", 1)[-1]]
        dtype = getattr(dtype, "legacy_dtype", dtype)
        return elementwise.astype(self, dtype)

    def bfloat16(self) -> Tensor:
        return elementwise.astype(self, dtypes.bfloat16)


# The op modules import Tensor from here, so they are imported after it is defined.
from minidist.tensor import (autograd, creation, elementwise, functional, inplace,  # noqa: E402
                             linalg, mathops, printing, random, reduce, views)
from minidist.tensor import shape as shape_ops  # noqa: E402
