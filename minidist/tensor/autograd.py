"""The backward engine: walk the tape in reverse, accumulate leaf grads in place, fire hooks.

    loss.backward()      # == run_backward(loss)

Forward recorded, for every op result, its inputs and a closure ``g -> (g_in1, g_in2, ...)``.
Backward:

1. orders the tensors that reach the root through tensors that require grad topologically
   (inputs before outputs);
2. visits them in reverse (micrograd's ``for v in reversed(topo): v._backward()``): an
   intermediate sums the gradients its consumers sent it and its closure turns the sum into
   its inputs' gradients; a leaf adds each contribution into ``leaf.grad`` IN PLACE
   (contract 1: never rebinds it);
3. a leaf is visited right after its last consumer, so its gradient for this backward is
   complete then: its post-accumulate-grad hooks fire (contract 2), and DDP can start
   reducing that bucket while the earlier layers are still being differentiated;
4. drops each node's closure and inputs once used (unless ``retain_graph=True``), so the
   activations of a step are freed and memory does not grow across steps;
5. when the walk is done, runs the callbacks queued during it (``queue_callback``), in order:
   the end-of-backward point, where DDP checks that every bucket was reduced.

Leaves with a reserved gradient buffer (``GradDestination``, DDP's bucket slots) and the ops
that write a gradient in place live beside the walk, in grad_destination.py: the walk only
hands it a leaf's first gradient (``store_first``).

    run_backward(loss)
      |-- walk the tape; hooks fire as leaves complete; a hook may call queue_callback(fn)
      '-- callbacks: fn() for each queued fn (and any fn that those queue), then return
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Callable

from minidist import tracing as trace
from minidist import xp as backend
from minidist.tensor.core import Tensor, as_array, error
from minidist.tensor.grad_destination import (GradDestination, claim_grad_destination,
                                              store_first)

_handle_ids = itertools.count()


class _Running(threading.local):
    """Per thread: one list of queued callbacks per backward running on it (innermost last):
    a hook may itself call backward, and each backward runs only its own callbacks."""

    def __init__(self) -> None:
        self.frames: list[list[Callable[[], None]]] = []


_running = _Running()


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
    frames = _running.frames
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


def _topological_order(root: Tensor) -> list[Tensor]:
    """The tensors reachable from root through requires-grad edges, each after its inputs.

    Iterative post-order DFS (deep graphs do not hit the recursion limit). A node's leaf
    inputs are explored after its other inputs, so in reverse order a leaf comes right after
    its last consumer: its gradient is complete then, and its hooks fire while the earlier
    layers are still to be differentiated (a Linear's bias, then its weight).
    """
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
        elif id(node) not in visited:
            visited.add(id(node))
            stack.append((node, True))
            inputs = [p for p in reversed(node._parents) if p.requires_grad]
            stack += [(p, False) for p in inputs if p._backward is None]  # leaves: popped last
            stack += [(p, False) for p in inputs if p._backward is not None]
    return order


def _accumulate(leaf: Tensor, g: Any) -> None:
    """``leaf.grad += g`` in place (contract 1); the first contribution is stored.

    The first gradient of a leaf is stored by ``grad_destination.store_first``: into its
    reserved buffer, or as a copy the leaf owns. An op that wrote the gradient in place
    (``claim_grad_destination``, ``adopt_grad``) returned ``leaf.grad`` itself: nothing to add.
    """
    if g.shape != leaf.array.shape:  # an op's backward broke its contract; not a user error
        raise AssertionError(f"gradient of shape {g.shape} for a leaf of shape {leaf.array.shape}")
    if leaf._grad is None:
        store_first(leaf, g)
    elif g is not leaf._grad:
        if leaf._grad_dest is None:
            xp = backend.get_array_module(leaf._grad)
            xp.add(leaf._grad, g, out=leaf._grad, casting="unsafe")
        else:  # a reserved buffer: its destination adds it (``GradDestination.add``)
            leaf._grad_dest.add(leaf._grad, g)


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
    seed = seed_gradient(root, gradient)
    callbacks: list[Callable[[], None]] = []
    _running.frames.append(callbacks)
    try:
        with trace.span("backward"):  # the step timeline (minidist/tracing.py); off: nothing
            walk_tape(root, seed, retain_graph, _accumulate, _fire_hooks)
            for callback in callbacks:  # a callback may queue more: they join the end
                callback()
    finally:  # an error in the walk drops the queued callbacks
        _running.frames.pop()


def seed_gradient(root: Tensor, gradient: Any) -> Any:
    """The gradient the walk starts from: 1 for a scalar root, else ``gradient``."""
    if not root.requires_grad:
        raise RuntimeError(error(
            "backward", f"called on a tensor of shape {root.shape} that does not require grad: "
            "no input with requires_grad=True went into it, or it was computed under no_grad(). "
            "Make sure the parameters require grad and the forward runs outside no_grad()."))
    if gradient is None:
        if root.array.size != 1:
            raise ValueError(error(
                "backward", f"called on a tensor of shape {root.shape}; backward needs a scalar "
                "loss (call .sum() or .mean() first) or pass gradient=..."))
        return backend.get_array_module(root.array).ones_like(root.array)
    seed = as_array(gradient, root.array.dtype)
    if seed.shape != root.array.shape:
        raise ValueError(error(
            "backward", f"gradient has shape {tuple(seed.shape)} but the tensor has shape "
            f"{root.shape}. Pass a gradient of the tensor's shape."))
    return seed


def walk_tape(root: Tensor, seed: Any, retain_graph: bool,
              deliver: Callable[[Tensor, Any], None], complete: Callable[[Tensor], None]) -> None:
    """The backward walk (steps 1-4 of the module docstring).

    Every tensor is visited after all its consumers (reverse topological order). An
    intermediate's contributions are summed and passed through its closure; a leaf's are
    handed to ``deliver(leaf, g)`` one by one, in arrival order (``_accumulate``, or
    ``grad()``'s capture), then ``complete(leaf)`` runs (``_fire_hooks``).
    """
    grads: dict[int, list[Any]] = {id(root): [seed]}  # contributions received so far
    for node in reversed(_topological_order(root)):
        contributions = grads.pop(id(node), [])
        if node._backward is None:  # a leaf
            for g in contributions:
                deliver(node, g)
            if contributions:
                complete(node)
            continue
        if contributions:  # summed into a new array: a contribution may alias another one
            g = sum(contributions[1:], contributions[0])
            for parent, pg in zip(node._parents, node._backward(g)):
                if pg is not None and parent.requires_grad:
                    grads.setdefault(id(parent), []).append(pg)
        if not retain_graph:
            node._backward, node._parents = _freed, ()


# torch.autograd.grad (the gradients returned, not accumulated): autograd_grad.py
from minidist.tensor.autograd_grad import grad  # noqa: E402

__all__ = ["GradDestination", "RemovableHandle", "claim_grad_destination", "grad",
           "queue_callback", "register_post_accumulate_grad_hook", "run_backward"]
