"""DataLoader's worker threads (``num_workers > 0``): the next batches are built ahead.

With ``num_workers=N > 0``, N background threads build the next ``prefetch_factor * N``
batches while the training loop uses the current one (batches still come out in order, and
the same batches as with ``num_workers=0``). Threads, not processes: NumPy's indexing and
copies release the GIL, and nothing has to be pickled. ``persistent_workers=True`` keeps the
threads between passes. An exception raised while building a batch is raised by the loop at
that batch.
"""

from __future__ import annotations

from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minidist.data.loader import DataLoader


def prefetched(loader: DataLoader, order: Any, slices: list[slice]
               ) -> Generator[Any, None, None]:
    """The batches ``loader.gather(order[sl])`` of ``slices``, in order, each built by a
    worker thread up to ``num_workers * prefetch_factor`` batches ahead."""
    pool = start_workers(loader)
    ahead = loader.num_workers * loader.prefetch_factor
    pending: list[Future] = []
    try:
        for b in range(len(slices)):
            while len(pending) < ahead and b + len(pending) < len(slices):
                pending.append(pool.submit(loader.gather, order[slices[b + len(pending)]]))
            yield pending.pop(0).result(timeout=loader.timeout or None)
    finally:
        for f in pending:  # a loop left early: drop the batches nobody will read
            f.cancel()
        if not loader.persistent_workers:
            stop_workers(loader)


def start_workers(loader: DataLoader) -> ThreadPoolExecutor:
    """The loader's pool of ``num_workers`` threads (started once; kept between passes with
    ``persistent_workers``)."""
    if loader._pool is None:
        ids = iter(range(loader.num_workers))
        init = loader.worker_init_fn
        loader._pool = ThreadPoolExecutor(
            loader.num_workers, thread_name_prefix="minidist-dataloader",
            initializer=None if init is None else lambda: init(next(ids)))
    return loader._pool


def stop_workers(loader: DataLoader) -> None:
    if loader._pool is not None:
        loader._pool.shutdown(wait=True, cancel_futures=True)
        loader._pool = None
