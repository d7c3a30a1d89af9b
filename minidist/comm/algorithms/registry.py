"""What an all-reduce algorithm tells the rest of minidist: one ``Algorithm`` entry per file.

    RING = Algorithm("ring", ring_all_reduce, cost=ring_cost,
                     constants=model(alpha_us=6.0, beta_us_per_byte=2.5e-4))
    RING(transport, buf, ReduceOp.SUM)           # an entry runs like its function
    RING.usable(transport, buf, 0)               # may "auto" run it on this buffer and stream?

Each algorithm module ends with its entry; ``minidist.comm.algorithms.ALGORITHMS`` lists them
(name -> entry), and everything that needs to know the algorithms loops over that registry:
the planner ("auto": which entries are usable for this call, then the cheapest by the cost
model), ``select`` (the cost formulas and default constants), ``calibrate``/``tune`` (which
algorithms to time) and the debug-mode consistency check (the names). Adding an algorithm that
"auto" may pick is one new module ending with its entry, plus its line in ``ALGORITHMS`` (or, in a
wing, ``register(entry)``).

An entry's fields:

    run          run(transport, buf, op, tag=0): in place on a 1-D contiguous array; it
                 checks its own preconditions on every call (a clear error when they fail)
    usable       usable(transport, buf, stream) -> bool: the capability check "auto" makes
                 (MPI's Allreduce needs the MPI transport, "shm" a shared-memory node and a
                 NumPy buffer on stream 0, ...); explicit ``algorithm=`` calls skip it and get
                 the algorithm's own error instead
    prepare      prepare(transport) -> run(buf, op, tag), or None: the algorithm with what
                 ``usable`` established bound once ("shm": its shared-memory node). The
                 planner runs it for a plan whose buffer kind ``usable`` accepted (the plan is
                 memoized per buffer kind and stream 0 or not, so the facts hold for every
                 call of the plan); otherwise the plan runs ``run``, which checks
    cost         cost(n, K, alpha, beta, gamma) -> microseconds (K bytes, n ranks), or None:
                 "auto" never weighs it (it reaches it by a rule, or not at all)
    constants    the model's default alpha (us per message), beta (us per byte moved), gamma
                 (us per byte reduced); ``select.MODEL`` starts from them, a fit replaces them
    variants     more model rows with the same formula and their own constants ("shm_zc":
                 "shm" on a buffer that already lies in a shared window)
    candidate    "auto" may choose it by the model (False: "direct", the oracle)
    preferred    a reason: when ``usable``, "auto" takes it before weighing the others
                 ("cuda_ipc": device buffers on one node), in registry order
    refine       refine(world_size, nbytes, calibration) -> (name, reason), or None: a
                 preferred entry's measured exception ("cuda_ipc" hands small device buffers
                 to "host_copy" below the cut-over a calibration measured on a GPU)
    check        check(transport) -> None, or None: raises the algorithm's own error when it
                 cannot run on this transport at all ("mpi" without MPI), so an explicit
                 request fails before any message is sent
    takes_device_buffers   it reads device (CuPy) memory itself, so the planner never stages
                 the buffer through host memory for it (minidist/fastpath/staging.py)
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
    variants: dict = field(default_factory=dict)
    candidate: bool = True
    preferred: str | None = None
    refine: Callable[[int, int, Any], tuple[str, str]] | None = None
    takes_device_buffers: bool = False
    prepare: Callable[[Any], Callable[[Any, Any, int], None]] | None = None
    check: Callable[[Any], None] | None = None

    def __call__(self, transport: Any, buf: Any, op: Any, tag: int = 0) -> None:
        """Run the algorithm: ``run(transport, buf, op, tag)``."""
        self.run(transport, buf, op, tag)


__all__ = ["Algorithm", "always", "model"]
