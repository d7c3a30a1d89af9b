"""``run_threads``: a function on N thread ranks of one ``ThreadWorld`` (tests, examples).

    results = run_threads(4, body, timeout_s=30)   # list indexed by rank; raises naming the rank

``minidist.comm.transports.threads`` re-exports it (its usage example starts there).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from minidist.comm.errors import CommError
from minidist.comm.transports.threads import ThreadTransport, ThreadWorld


def run_threads(n: int, fn: Callable[[ThreadTransport], Any], timeout_s: float = 60.0,
                world: ThreadWorld | None = None) -> list:
    """Run ``fn(transport)`` on ``n`` thread ranks; return the results indexed by rank.

    Raises:
        RuntimeError: naming the first rank that raised (chained to its exception); the other
            ranks are woken with CommError so nothing hangs.
        TimeoutError: naming the ranks still running after ``timeout_s``.
    """
    world = world or ThreadWorld(n, timeout_s=timeout_s)
    results: list = [None] * n
    errors: dict = {}

    def target(rank: int) -> None:
        try:
            results[rank] = fn(world.transport(rank))
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            errors[rank] = e
            world.abort(f"rank {rank} raised {type(e).__name__}: {e}")

    threads = [threading.Thread(target=target, args=(r,), name=f"rank{r}", daemon=True)
               for r in range(n)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + timeout_s
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    alive = [r for r, th in enumerate(threads) if th.is_alive()]
    if alive:
        world.abort("run_threads timed out")
        raise TimeoutError(f"run_threads({n}): ranks {alive} still running after {timeout_s} s "
                           f"(errors so far: {errors})")
    if errors:
        # Report the root cause: a rank whose error is not the abort echo of another rank's.
        first = min(errors, key=lambda r: (isinstance(errors[r], CommError)
                                           and "aborted" in str(errors[r]), r))
        raise RuntimeError(f"run_threads({n}): rank {first} raised "
                           f"{type(errors[first]).__name__}: {errors[first]}") from errors[first]
    return results
