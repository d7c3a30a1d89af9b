"""torch's in-place arithmetic (``add_``, ``mul_``, ``clamp_``, ``addcdiv_``...), autograd rules.

    with minidist.no_grad():
        p.add_(p.grad, alpha=-lr)           # SGD's update, in p's own memory
    mu.mul_(momentum).add_(dp)              # a buffer that does not require grad: in place
    c.div_(batch_size)                      # an op result on the tape: recorded, as in torch

Which of three cases applies, in torch's order:

    leaf that requires grad, grad mode on  ->  RuntimeError (torch's rule: the values the tape
                                               needs would change under it); write under
                                               ``no_grad()``, as optimizers do
    nothing on the tape (grad mode off, or no input requires grad)
                                           ->  computed into the tensor's own array (``out=``):
                                               views of it, DDP's bucket views and optimizer
                                               buffers see the new values, no new array
    a tensor on the tape (an op result that requires grad, or an input that does)
                                           ->  the out-of-place op is recorded and the tensor
                                               takes over the new node and its new array; the
                                               old values stay with the node that needs them

The last case differs from torch in one way: the tensor gets a new array, so a view of the old
one (or the tensor it was a view of) keeps the old values, where torch writes through views.
The result keeps the tensor's dtype; a result NumPy could not cast to it in the same kind
(a float into an int tensor) raises, as torch does.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy

from minidist import xp as backend
from minidist.tensor.core import Tensor, error
from minidist.tensor.grad_mode import is_grad_enabled


def _value(other: Any) -> Any:
    """The array (or Python scalar) behind an operand."""
    return other.data if isinstance(other, Tensor) else other


def _on_tape(t: Tensor, *others: Any) -> bool:
    return is_grad_enabled() and (t.requires_grad or any(
        isinstance(o, Tensor) and o.requires_grad for o in others))


def check_leaf(t: Tensor, op: str) -> None:
    """torch's rule: no in-place op on a leaf that requires grad while grad mode is on."""
    if t.requires_grad and t.is_leaf and is_grad_enabled():
        raise RuntimeError(error(op, "a leaf tensor that requires grad is used in an in-place "
                                 "operation (torch refuses it too: the tape needs its values). "
                                 "Update parameters under `with minidist.no_grad():`, as "
                                 "optimizers do, or use the out-of-place form "
                                 f"(x = x.{op.rstrip('_')}(...))."))


def _store(t: Tensor, op: str, result: Any) -> None:
    """Write ``result`` into ``t``'s array, refusing a cast torch would refuse."""
    if result.dtype != t.data.dtype:
        _check_cast(op, result.dtype, t.data.dtype)
    t.data[...] = result


def apply(t: Tensor, op: str, compute: Callable[[Tensor], Tensor], fast: Callable[[], Any],
          *operands: Any) -> Tensor:
    """Run an in-place op on ``t`` under the rules above.

    Args:
        t: the tensor to update.
        op: its name, for errors (``"add_"``).
        compute: ``old -> result`` with tape ops (the recorded case).
        fast: writes the new values into ``t.data`` directly (the untaped case).
        operands: the other inputs (Tensors or numbers), to tell whether the tape is involved.
    """
    check_leaf(t, op)
    if _on_tape(t, *operands):
        return _record_node(t, op, compute)
    fast()
    return t


def _record_node(t: Tensor, op: str, compute: Callable[[Tensor], Tensor]) -> Tensor:
    """The recorded case: ``old`` stands for t's previous node, t becomes the result."""
    old = Tensor.__new__(Tensor)
    old.data, old._grad, old._op, old._hooks, old._grad_dest = t.data, None, t._op, None, None
    old.requires_grad, old._parents, old._backward = t.requires_grad, t._parents, t._backward
    result = compute(old)
    if result.data.dtype != t.data.dtype:
        _check_cast(op, result.data.dtype, t.data.dtype)
        result = result.astype(t.data.dtype)
    t.data, t._parents, t._backward, t._op = result.data, result._parents, result._backward, op
    t.requires_grad = result.requires_grad
    return t


def _check_cast(op: str, src: Any, dst: Any) -> None:
    if not numpy.can_cast(src, dst, "same_kind"):
        raise RuntimeError(error(op, f"result type {src} can't be cast to the tensor's dtype "
                                 f"{dst} in place (torch refuses it too). Convert first "
                                 "(x = x.float()) or use the out-of-place form."))


def _into(t: Tensor, op: str, ufunc: str, *args: Any) -> None:
    """``xp.<ufunc>(*args, out=t.data)``: the new values in t's own memory, cast-checked."""
    xp = backend.get_array_module(t.data)
    args = tuple(backend.move(a, t.device) if hasattr(a, "shape") else a for a in args)
    try:
        getattr(xp, ufunc)(*args, out=t.data, casting="same_kind")
    except TypeError as e:  # NumPy's UFuncTypeError: the result does not fit t's dtype
        raise RuntimeError(error(op, f"{e}. In-place ops keep the tensor's dtype "
                                 f"({t.data.dtype}); torch refuses this cast too. Convert first "
                                 "(x = x.float()) or use the out-of-place form.")) from None


def _scaled(other: Any, alpha: Any) -> Any:
    v = _value(other)
    return v if alpha == 1 else v * alpha


# ---- the ops ----------------------------------------------------------------------------


def add_(t: Tensor, other: Any, alpha: Any = 1) -> Tensor:
    """``t += alpha * other``, in place (torch's ``add_(other, alpha=1)``)."""
    return apply(t, "add_", lambda a: a + (other if alpha == 1 else other * alpha),
                 lambda: _into(t, "add_", "add", t.data, _scaled(other, alpha)), other)


def sub_(t: Tensor, other: Any, alpha: Any = 1) -> Tensor:
    """``t -= alpha * other``, in place."""
    return apply(t, "sub_", lambda a: a - (other if alpha == 1 else other * alpha),
                 lambda: _into(t, "sub_", "subtract", t.data, _scaled(other, alpha)), other)


def mul_(t: Tensor, other: Any) -> Tensor:
    """``t *= other``, in place."""
    return apply(t, "mul_", lambda a: a * other,
                 lambda: _into(t, "mul_", "multiply", t.data, _value(other)), other)


def div_(t: Tensor, other: Any) -> Tensor:
    """``t /= other``, in place."""
    return apply(t, "div_", lambda a: a / other,
                 lambda: _into(t, "div_", "true_divide", t.data, _value(other)), other)


def pow_(t: Tensor, exponent: Any) -> Tensor:
    """``t **= exponent``, in place."""
    return apply(t, "pow_", lambda a: a ** exponent,
                 lambda: _into(t, "pow_", "power", t.data, _value(exponent)), exponent)


def clamp_(t: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """Clip ``t`` into ``[min, max]`` in place (either bound may be None)."""
    from minidist.tensor.mathops import clamp, clip_array
    return apply(t, "clamp_", lambda a: clamp(a, min, max),
                 lambda: _store(t, "clamp_", clip_array(t.data, _value(min), _value(max))),
                 min, max)


def addcmul_(t: Tensor, tensor1: Any, tensor2: Any, value: Any = 1) -> Tensor:
    """``t += value * tensor1 * tensor2``, in place (Adam's second moment, torch's spelling)."""
    def fast() -> None:
        prod = _value(tensor1) * _value(tensor2)
        _into(t, "addcmul_", "add", t.data, prod if value == 1 else prod * value)
    return apply(t, "addcmul_", lambda a: a + tensor1 * tensor2 * value, fast, tensor1, tensor2)


def addcdiv_(t: Tensor, tensor1: Any, tensor2: Any, value: Any = 1) -> Tensor:
    """``t += value * tensor1 / tensor2``, in place (Adam's update, torch's spelling)."""
    def fast() -> None:
        ratio = _value(tensor1) / _value(tensor2)
        _into(t, "addcdiv_", "add", t.data, ratio if value == 1 else ratio * value)
    return apply(t, "addcdiv_", lambda a: a + tensor1 / tensor2 * value, fast, tensor1, tensor2)

