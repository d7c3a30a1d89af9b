"""The backward engine: walk the tape in reverse, accumulate leaf grads in place, fire hooks.

    loss.backward()      # == run_backward(loss)

Forward recorded, for every op result, its inputs and a closure ``g -> (g_in1, g_in2, ...)``.
Backward:

1. collects the nodes that reach the root through tensors that require grad, in topological
   order (inputs before outputs), and counts, for each leaf, how many edges lead into it;
2. visits the nodes in reverse order: calls the closure with the node's gradient and routes the
   results to the inputs. An intermediate input sums its contributions in a dict; a leaf adds
   each contribution straight into ``leaf.grad`` IN PLACE (contract 1: never rebinds it);
3. when a leaf's last edge has delivered, its gradient for this backward is complete: its
   post-accumulate-grad hooks fire then (contract 2), so DDP can start reducing that bucket
   while the earlier layers are still being differentiated;
4. drops each node's closure and inputs once used (unless ``retain_graph=True``), so the
   activations of a step are freed and memory does not grow across steps;
5. when the walk is done, runs the callbacks queued during it (``queue_callback``), in order:
   the end-of-backward point, where DDP checks that every bucket was reduced.

A leaf may carry a ``GradDestination``: a buffer reserved for its gradient (DDP reserves each
parameter's slot of a flat bucket). While the leaf's ``.grad`` is None, backward writes the
gradient straight into that buffer and makes it ``.grad``; an op that can compute the
gradient in place asks for it with ``claim_grad_destination`` (``linear``'s weight gradient:
one GEMM with ``out=`` the slot), for any other op the walk copies the result in::

    leaf.grad is None, destination D   op claims D: writes scale * grad into D.buffer (GEMM out=)
                                       op does not: D.buffer[...] = scale * grad    (one copy)
                                       then leaf.grad = D.buffer
    leaf.grad is an array              leaf.grad += scale * grad   (in place, as always)

    run_backward(loss)
      |-- walk the tape; hooks fire as leaves complete; a hook may call queue_callback(fn)
      '-- callbacks: fn() for each queued fn (and any fn that those queue), then return
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable, Sequence

from minidist import tracing as trace
from minidist import xp as backend
from minidist.tensor.core import Tensor, as_array, error
from minidist.tensor.grad_destination import GradDestination

_handle_ids = itertools.count()
# One list of queued callbacks per backward that is running on this thread (innermost last):
# a hook may itself call backward, and each backward runs only its own callbacks. Beside it,
# per backward, the destinations its ops claimed (``claims``; None in ``grad()``: nothing may
# be written into ``.grad`` there).
_running = threading.local()


def claim_grad_destination(tensor: Tensor) -> GradDestination | None:
    """For an op's backward: the buffer to write ``tensor``'s gradient into, or None.

    Non-None only while a backward that accumulates into ``.grad`` is running (not ``grad()``),
    ``tensor`` is a leaf with a ``GradDestination`` and its ``.grad`` is None, and only the
    first time it is asked in this backward (a leaf used twice by one op gets one buffer).
    An op that gets one MUST write ``scale * gradient`` into ``dest.buffer`` and return
    ``dest.buffer`` itself as that input's gradient; the walk then makes it ``.grad`` with no
    copy::

        dest = claim_grad_destination(weight)
        gw = mm(g2.T, x2) if dest is None else mm(g2.T, x2, out=dest.buffer, scale=dest.scale)
    """
    dest = tensor._grad_dest
    if dest is None or tensor._grad is not None:
        return None
    stack = getattr(_running, "claims", None)
    claims = stack[-1] if stack else None
    if claims is None or id(tensor) in claims:
        return None
    claims[id(tensor)] = (tensor, dest.buffer)
    return dest


class RemovableHandle:
    """Returned by ``register_post_accumulate_grad_hook``; ``remove()`` unregisters the hook."""

    def __init__(self, tensor: Tensor, key: int) -> None:
        self._tensor = weakref.ref(tensor)
        self._key = key

    def remove(self) -> None:
        """Unregister the hook (a no-op if it is already gone)."""
        tensor = self._tensor()
        if tensor is not None and tensor._hooks:
            tensor._hooks.pop(self._key, None)


def register_post_accumulate_grad_hook(tensor: Tensor, hook: Callable[[Tensor], None]
                                       ) -> RemovableHandle:
    """Call ``hook(tensor)`` once per backward, right after the leaf's grad is complete.

    "Complete" means every contribution of this backward has been added into ``tensor.grad``
    (a parameter used twice fires once, after both). Hooks fire in the order the tape finishes
    the leaves: reverse topological order, so the last layer's parameters come first. They
    never fire under ``no_grad`` (nothing is recorded) and only exist on leaves.

    Args:
        tensor: a leaf with ``requires_grad=True`` (a Parameter).
        hook: called with the tensor; its return value is ignored.

    Returns:
        A handle whose ``remove()`` unregisters the hook.
    """
    if not tensor.requires_grad or not tensor.is_leaf:
        raise RuntimeError(error(
            "register_post_accumulate_grad_hook", "hooks can only be registered on leaf tensors "
            f"that require grad (this one: requires_grad={tensor.requires_grad}, "
            f"is_leaf={tensor.is_leaf}). Register it on the parameter itself."))
    if tensor._hooks is None:
        tensor._hooks = {}
    key = next(_handle_ids)
    tensor._hooks[key] = hook
    return RemovableHandle(tensor, key)


def queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback()`` once, when the backward that is running now has finished.

    torch's ``Variable._execution_engine.queue_callback``. Call it from inside a backward
    (typically from a post-accumulate-grad hook): the callback runs after the whole tape was
    walked and every hook has fired, just before ``backward()`` returns, in the order the
    callbacks were queued. A callback may queue more callbacks; they run in the same backward.
    An exception raised by a callback propagates out of ``backward()`` (the callbacks after it
    do not run). If the backward itself fails, its queued callbacks are dropped.

    DDP uses it to check, at the end of the same backward, that every gradient bucket was
    completed and reduced (see minidist/ddp/reducer.py)::

        def hook(param):                          # fires during backward
            if first_gradient_of_this_step:
                queue_callback(check_every_bucket_was_reduced)

    Args:
        callback: a function of no arguments; its return value is ignored.

    Raises:
        RuntimeError: no backward is running on this thread.
    """
    frames = getattr(_running, "frames", None)
    if not frames:
        raise RuntimeError(error(
            "queue_callback", "no backward is running on this thread, so there is no end of "
            "backward to run the callback at. Call it from a hook during loss.backward()."))
    frames[-1].append(callback)


def _freed(g: Any) -> tuple:
    raise RuntimeError(error(
        "backward", "trying to backward through the graph a second time: its intermediate "
        "results were freed by the first backward(). Call backward(retain_graph=True) the first "
        "time if you really need two passes, or recompute the forward."))


def _topological_order(root: Tensor) -> tuple[list[Tensor], dict[int, int]]:
    """Nodes reachable from root through requires-grad edges (inputs first) + edges per leaf."""
    order: list[Tensor] = []
    leaf_edges: dict[int, int] = {}
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:  # iterative post-order DFS: deep graphs do not hit the recursion limit
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in node._parents:
            if not parent.requires_grad:
                continue
            if parent._backward is None:
                leaf_edges[id(parent)] = leaf_edges.get(id(parent), 0) + 1
            if id(parent) not in visited:
                stack.append((parent, False))
    return order, leaf_edges


def _adoptable(g: Any, leaf: Tensor) -> bool:
    """Whether ``g`` can become ``leaf.grad`` as it is: an owned, writable, contiguous array.

    Views (reshape/transpose/broadcast results) share memory with something else, so they are
    copied; so is anything of another dtype.
    """
    flags = g.flags
    return (bool(flags.owndata) and bool(getattr(flags, "writeable", True))
            and bool(flags.c_contiguous) and g.dtype == leaf.data.dtype)


def _accumulate(leaf: Tensor, g: Any, fresh: bool = False) -> None:
    """Add ``g`` into ``leaf.grad`` in place (cast to its dtype); allocate it if it is None.

    ``fresh`` says that no one else holds ``g`` (see ``run_backward``): then a leaf without a
    gradient adopts it instead of copying it, which saves one pass over every parameter. A
    leaf with a ``GradDestination`` gets ``scale * g`` written into (or added to) its buffer.
    """
    if g.shape != leaf.data.shape:  # an op's backward broke its contract; not a user error
        raise AssertionError(f"gradient of shape {g.shape} for a leaf of shape {leaf.data.shape}")
    dest = leaf._grad_dest
    if dest is not None:
        xp = backend.get_array_module(dest.buffer)
        if leaf._grad is None:  # the first write of this gradient: straight into the buffer
            if dest.scale == 1.0:
                xp.copyto(dest.buffer, g, casting="unsafe")
            else:
                xp.multiply(g, dest.scale, out=dest.buffer, casting="unsafe")
            leaf._grad = dest.buffer
            return
        if dest.scale != 1.0:
            g = g * dest.scale
    if leaf._grad is None:
        if fresh and _adoptable(g, leaf):
            leaf._grad = g  # a new array only this leaf will ever see
        else:
            leaf._grad = g.astype(leaf.data.dtype, copy=True)  # a fresh array the leaf owns
    else:
        xp = backend.get_array_module(leaf._grad)
        xp.add(leaf._grad, g, out=leaf._grad, casting="unsafe")


def _fire_hooks(leaf: Tensor) -> None:
    if leaf._hooks:
        for hook in list(leaf._hooks.values()):
            hook(leaf)


def run_backward(root: Tensor, gradient: Any = None, retain_graph: bool = False) -> None:
    """Backpropagate from ``root``, accumulating into the ``.grad`` of every leaf it reaches.

    Args:
        root: usually a scalar loss.
        gradient: d(something)/d(root), same shape as root; default 1 (root must be a scalar).
        retain_graph: keep the tape so backward can run through it again.

    Raises:
        ValueError: root is not a scalar and no gradient was given, or gradient has the wrong shape.
        RuntimeError: root does not require grad, or the graph was already freed.
    """
    _run(root, gradient, retain_graph, None)


def grad(outputs: Tensor, inputs: Sequence[Tensor], grad_outputs: Any = None,
         retain_graph: bool = False) -> tuple[Any, ...]:
    """torch.autograd.grad: the gradients of ``outputs`` w.r.t. ``inputs``, RETURNED.

    Nothing is accumulated into any ``.grad`` and no post-accumulate-grad hook fires: leaves
    that are not in ``inputs`` are simply skipped. Activation checkpointing
    (``minidist.utils.checkpoint``) uses it to differentiate a recomputed segment and hand
    the results to the outer backward, which then accumulates them and fires the hooks once.

    Args:
        outputs: the tensor to differentiate (a scalar, or pass ``grad_outputs``).
        inputs: leaf tensors; a leaf the graph does not reach gets None.
        grad_outputs: d(something)/d(outputs), same shape as outputs (default 1 for a scalar).
        retain_graph: keep the tape so backward can run through it again.

    Returns:
        One gradient (an xp array, or None) per input, in order.
    """
    capture: dict[int, Any] = {id(t): None for t in inputs}
    _run(outputs, grad_outputs, retain_graph, capture)
    return tuple(capture[id(t)] for t in inputs)


def _run(root: Tensor, gradient: Any, retain_graph: bool, capture: dict[int, Any] | None
         ) -> None:
    frames = getattr(_running, "frames", None)
    if frames is None:
        frames = _running.frames = []
    callbacks: list[Callable[[], None]] = []
    frames.append(callbacks)
    claims = getattr(_running, "claims", None)
    if claims is None:
        claims = _running.claims = []
    claims.append({} if capture is None else None)
    tr = trace.tracer()  # the step timeline (minidist/tracing.py); None when tracing is off
    t0 = tr.now() if tr is not None else 0.0
    try:
        _walk(root, gradient, retain_graph, capture)  # an error drops the queued callbacks
        i = 0
        while i < len(callbacks):  # a callback may queue more: they join the end of the list
            callbacks[i]()
            i += 1
    finally:
        frames.pop()
        claims.pop()
        if tr is not None:
            tr.complete("backward", t0, tr.now())


def _walk(root: Tensor, gradient: Any, retain_graph: bool, capture: dict[int, Any] | None
          ) -> None:
    """The backward walk itself (steps 1-4 of the module docstring).

    With ``capture`` (leaf id -> gradient or None), leaf gradients are summed into it instead
    of ``.grad`` (only for the leaves it lists) and no hook fires (``grad``).
    """
    if not root.requires_grad:
        raise RuntimeError(error(
            "backward", f"called on a tensor of shape {root.shape} that does not require grad: "
            "no input with requires_grad=True went into it, or it was computed under no_grad(). "
            "Make sure the parameters require grad and the forward runs outside no_grad()."))
    if gradient is None:
        if root.data.size != 1:
            raise ValueError(error(
                "backward", f"called on a tensor of shape {root.shape}; backward needs a scalar "
                "loss (call .sum() or .mean() first) or pass gradient=..."))
        xp = backend.get_array_module(root.data)
        seed = xp.ones_like(root.data)
    else:
        seed = as_array(gradient, root.data.dtype)
        if seed.shape != root.data.shape:
            raise ValueError(error(
                "backward", f"gradient has shape {tuple(seed.shape)} but the tensor has shape "
                f"{root.shape}. Pass a gradient of the tensor's shape."))

    if root._backward is None:  # backward on a leaf: its gradient is the seed itself
        if capture is not None:
            if id(root) in capture:
                capture[id(root)] = seed
            return
        _accumulate(root, seed)
        _fire_hooks(root)
        return

    order, leaf_edges = _topological_order(root)
    grads: dict[int, Any] = {id(root): seed}
    delivered: set[int] = set()  # leaves that received at least one gradient this pass
    # ids of every array routed so far: an array routed twice (an add's (g, g), a pass-through
    # of a gradient that also went elsewhere) is shared, and a leaf must not adopt it. An id
    # reused after its array was freed only costs a copy, never a wrong result.
    routed: set[int] = {id(seed)}
    claims = _running.claims[-1]  # leaf id -> (leaf, buffer) an op wrote in place (None: grad())
    for node in reversed(order):
        if node._backward is None:
            continue  # a leaf: handled when its consumers route to it
        g = grads.pop(id(node), None)
        parents = node._parents
        parent_grads = node._backward(g) if g is not None else (None,) * len(parents)
        written = None
        if claims:  # the op wrote these leaves' gradients into their destinations: adopt them
            written = dict(claims)  # now, so another gradient for the same leaf adds onto it
            claims.clear()
            for leaf, buf in written.values():
                leaf._grad = buf
        # Route in reverse input order: Linear(x, weight, bias) finishes bias before weight,
        # so hooks fire in exactly the reverse of parameters() order.
        for i in range(len(parents) - 1, -1, -1):
            parent, pg = parents[i], parent_grads[i]
            if not parent.requires_grad:
                continue
            key = id(parent)
            if parent._backward is None and capture is not None:
                if pg is not None and key in capture:  # summed in arrival order, as .grad is
                    prev = capture[key]
                    capture[key] = pg if prev is None else prev + pg
            elif parent._backward is None:
                if pg is not None:
                    if written is not None and key in written and written[key][1] is pg:
                        del written[key]  # already in its .grad (the destination)
                    else:
                        fresh = id(pg) not in routed and sum(q is pg for q in parent_grads) == 1
                        _accumulate(parent, pg, fresh)
                    delivered.add(key)
                leaf_edges[key] -= 1
                if leaf_edges[key] == 0 and key in delivered:
                    _fire_hooks(parent)
            elif pg is not None:
                prev = grads.get(key)
                grads[key] = pg if prev is None else prev + pg  # never in place: pg may alias
        if written:  # an op claimed a destination and did not return it: a bug in that op
            raise AssertionError(f"{node._op}: claimed gradient destination(s) it did not "
                                 f"return ({len(written)} leaf/leaves)")
        routed.update(id(q) for q in parent_grads if q is not None)
        if not retain_graph:
            node._backward, node._parents = _freed, ()
