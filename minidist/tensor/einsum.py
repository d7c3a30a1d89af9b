"""torch's ``einsum(equation, *operands)`` with its gradient.

    sim = minidist.einsum("nc,kc->nk", q, queue)      # MoCo's logits against a queue
    pos = minidist.einsum("nc,nc->n", [q, k])          # operands as a list too, as torch

The forward is NumPy's (or CuPy's) ``einsum``. The gradient of operand i is another einsum: the
output gradient against the other operands, producing operand i's subscripts. A subscript that
appears only in operand i (summed away inside it) comes back by broadcasting, and ``...`` is
replaced by letters the equation does not use. A subscript repeated within one operand (a
diagonal, ``"ii->i"``) is refused: take ``minidist.diagonal`` first.
"""

from __future__ import annotations

import string
from typing import Any

from minidist import xp as backend
from minidist.tensor.core import Tensor, error


def _parse(equation: str, ndims: list[int]) -> tuple[list[str], str]:
    """Operand subscripts and output subscripts, with ``...`` spelled out as letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    subs = lhs.split(",")
    if len(subs) != len(ndims):
        raise ValueError(error("einsum", f"{equation!r} names {len(subs)} operands, got "
                               f"{len(ndims)}."))
    free = [c for c in string.ascii_letters if c not in eq]
    ell_n = max((n - len(s.replace("...", "")) for s, n in zip(subs, ndims) if "..." in s),
                default=0)
    ell = "".join(free[:ell_n])
    subs = [s.replace("...", ell[len(ell) - (n - len(s.replace("...", ""))):] if n - len(
        s.replace("...", "")) else "") for s, n in zip(subs, ndims)]
    if arrow:
        out = rhs.replace("...", ell)
    else:  # torch's implicit output: the letters seen once, in alphabetical order
        letters = "".join(subs)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1
                                   and c not in ell))
    for s in subs:
        if len(set(s)) != len(s):
            raise ValueError(error("einsum", f"{equation!r}: a subscript repeated within one "
                                   "operand (a diagonal) is not supported; take "
                                   "minidist.diagonal(x) first."))
    return subs, out


def einsum(equation: str, *operands: Any) -> Tensor:
    """torch's ``einsum``: sum of products over the subscripts the output leaves out."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    tensors = tuple(t if isinstance(t, Tensor) else Tensor(t) for t in operands)
    arrays = [t.array for t in tensors]
    subs, out_sub = _parse(equation, [a.ndim for a in arrays])
    xp = backend.get_array_module(arrays[0])
    out = xp.einsum(f"{','.join(subs)}->{out_sub}", *arrays)
    sizes = {c: n for s, a in zip(subs, arrays) for c, n in zip(s, a.shape) if n != 1}

    def backward(g: Any) -> tuple:
        grads = []
        for i, (s, a) in enumerate(zip(subs, arrays)):
            others = [(subs[j], arrays[j]) for j in range(len(arrays)) if j != i]
            known = set(out_sub).union(*[set(o) for o, _ in others])
            keep = "".join(c for c in s if c in known)
            spec = ",".join([out_sub] + [o for o, _ in others]) + "->" + keep
            gi = xp.einsum(spec, g, *[arr for _, arr in others])
            # letters only operand i had were summed inside it: broadcast them back; dims of
            # size 1 that were broadcast against others are summed down to 1
            shaped = gi.reshape([gi.shape[keep.index(c)] if c in keep else 1 for c in s])
            full = [sizes.get(c, 1) if c not in keep else shaped.shape[k]
                    for k, c in enumerate(s)]
            gi = xp.broadcast_to(shaped, full)
            axes = tuple(k for k, n in enumerate(a.shape) if n == 1 and gi.shape[k] != 1)
            grads.append(gi.sum(axis=axes, keepdims=True) if axes else gi)
        return tuple(grads)

    return Tensor._make(out, tensors, backward, "einsum")


__all__ = ["einsum"]
