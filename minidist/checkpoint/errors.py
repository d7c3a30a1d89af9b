"""CheckpointError: the one exception for checkpoints that cannot be written, read or used."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read, or does not match what it is loaded into.

    Attributes:
        path: the file concerned (None if not about one file).
        reason: the problem in a few words, without the advice (resume prints it when it
            skips a damaged checkpoint).
    """

    def __init__(self, message: str, *, path: str | Path | None = None,
                 reason: str | None = None) -> None:
        super().__init__(message)
        self.path = None if path is None else Path(path)
        self.reason = reason or message
