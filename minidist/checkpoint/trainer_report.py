"""What a Trainer tells the people watching it: rank 0's log lines, the progress bar, the
note that an epoch's time includes compiling kernels, and the merged trace.

``TrainerReport`` is a base class of ``minidist.trainer.Trainer`` (its methods read the
Trainer's ``config`` and ``rank``); ``draw_progress`` draws the bar on stderr and ``compile_note``
words the compile note. Messages log under ``minidist.trainer`` (not verbose: INFO).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from minidist import comm
from minidist import tracing as trace
from minidist.kernels import jit_cache
from minidist.logger import get_logger

log = get_logger("minidist.trainer")


class TrainerReport:
    """The Trainer's output for people (see the module)."""

    config: Any
    rank: int
    world_size: int

    def _progress_enabled(self) -> bool:
        if self.rank != 0:
            return False
        if self.config.progress_bar is not None:
            return self.config.progress_bar
        return sys.stderr.isatty() and not os.environ.get("CI")

    def _merge_trace(self) -> None:
        """Tracing on: write this rank's timeline; rank 0 merges all ranks into trace.json."""
        tr = trace.tracer()
        if tr is None:
            return
        tr.flush()
        if self.world_size > 1:
            comm.barrier()  # every rank's file is complete before rank 0 reads them
        if self.rank == 0:
            self._log(f"trace: {trace.merge(tr.directory)} (open in https://ui.perfetto.dev)")

    def _log(self, message: str) -> None:
        """Rank 0 only: print (progress for people) when verbose, else log at INFO."""
        if self.rank != 0:
            return
        if self.config.verbose:
            print(message, flush=True)
        else:
            log.info(message)


def draw_progress(done: int, total: int, epoch: int, loss: float, width: int = 30) -> None:
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\repoch {epoch + 1} [{'#' * filled}{'.' * (width - filled)}] "
                     f"{done}/{total} loss {loss:.4f}")
    sys.stderr.flush()


def compile_note(before: jit_cache.Stats, after: jit_cache.Stats) -> str:
    """What an epoch line adds when its time includes compiling the fused kernels (this
    process compiled, or waited for another process of the machine compiling them): the
    first epoch of the first run on a machine; later runs load them from the disk cache."""
    if after.compiles == before.compiles and after.waited == before.waited:
        return ""
    return (f"  (incl. {after.seconds - before.seconds:.2f}s compiling fused kernels for "
            "this machine, once)")
