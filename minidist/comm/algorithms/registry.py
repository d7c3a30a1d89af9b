"""What an all-reduce algorithm tells the rest of minidist: one ``Algorithm`` entry per file.

    RING = Algorithm("ring", ring_all_reduce, cost=ring_cost,
                     constants=model(alpha_us=6.0, beta_us_per_byte=2.5e-4))
    RING(transport, buf, ReduceOp.SUM)           # an entry runs like its function
    RING.usable(transport, buf, 0)               # may "auto" run it on this buffer and stream?

Each algorithm module ends with its entry; ``minidist.comm.algorithms.ALGORITHMS`` lists them
(name -> entry), and everything that needs to know the algorithms loops over that registry:
the planner, the auto wing's cost model and calibration, the debug-mode consistency check.
Adding an algorithm is one new module ending with its entry, plus its line in ``ALGORITHMS``
(or, in a wing, ``register(entry)``). The textbook's fields:

    run          run(transport, buf, op, tag=0): in place on a 1-D contiguous array; it
                 checks its own preconditions on every call (a clear error when they fail)
    cost         cost(n, K, alpha, beta, gamma) -> microseconds (K bytes, n ranks), or None:
                 "auto" never weighs it
    constants    the model's default alpha (us per message), beta (us per byte moved), gamma
                 (us per byte reduced); a calibration replaces them
    candidate    "auto" may choose it by the model (False: "direct", the oracle)
    usable       usable(transport, buf, stream) -> bool: the capability check "auto" makes;
                 explicit ``algorithm=`` calls skip it and get the algorithm's own error

The other fields serve the fast-path wing's algorithms (a comment on each, below).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

Cost = Callable[[int, float, float, float, float], float]
Usable = Callable[[Any, Any, int], bool]


def model(alpha_us: float, beta_us_per_byte: float, gamma_us_per_byte: float = 2.5e-4) -> dict:
    """The alpha-beta-gamma constants of one model row, as ``select.MODEL`` holds them."""
    return {"alpha_us": alpha_us, "beta_us_per_byte": beta_us_per_byte,
            "gamma_us_per_byte": gamma_us_per_byte}


def always(transport: Any, buf: Any, stream: int) -> bool:
    """``usable`` of an algorithm that runs on every transport (point-to-point messages)."""
    return True


@dataclass(frozen=True)
class Algorithm:
    """One all-reduce algorithm of the registry (see the module docstring for each field)."""

    name: str
    run: Callable[..., None]
    usable: Usable = always
    cost: Cost | None = None
    constants: dict = field(default_factory=dict)
    variants: dict = field(default_factory=dict)  # more model rows: "shm_zc" of "shm"
    candidate: bool = True
    preferred: str | None = None  # a reason: when usable, "auto" takes it before the model
    # refine(world_size, nbytes, calibration) -> (name, reason): a preferred entry's measured
    # exception ("cuda_ipc" hands small buffers to "host_copy")
    refine: Callable[[int, int, Any], tuple[str, str]] | None = None
    takes_device_buffers: bool = False  # reads device memory itself: never staged via host
    # prepare(transport, buf) -> run(buf, op, tag): bound once for a plan (one size and dtype)
    # whose buffer kind usable accepted ("shm": its node, or a small buffer's mailboxes);
    # check(transport): its own error where it can never run
    prepare: Callable[[Any, Any], Callable[[Any, Any, int], None]] | None = None
    check: Callable[[Any], None] | None = None

    def __call__(self, transport: Any, buf: Any, op: Any, tag: int = 0) -> None:
        """Run the algorithm: ``run(transport, buf, op, tag)``."""
        self.run(transport, buf, op, tag)


__all__ = ["Algorithm", "always", "model"]
