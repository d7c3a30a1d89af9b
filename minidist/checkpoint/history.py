"""History: the per-epoch metrics of a training run, saved with its checkpoints.

    history = trainer.fit(train_set, val_set)
    history.train_losses[-1], history.samples_per_second
    history.to_json("runs/exp1/history.json")       # written atomically
    History.from_dict(ckpt["history"])              # how resume restores it

``minidist.trainer`` imports it from here (``from minidist.trainer import History`` keeps
working).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class History:
    """Per-epoch metrics of a run (averaged over all ranks) and its throughput."""

    train_losses: list = field(default_factory=list)
    train_accuracies: list = field(default_factory=list)
    val_losses: list = field(default_factory=list)
    val_accuracies: list = field(default_factory=list)
    epoch_times: list = field(default_factory=list)
    total_time_seconds: float = 0.0
    samples_per_second: float = 0.0
    effective_batch_size: int = 0
    world_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path | None = None) -> str:
        """The history as JSON; also written (atomically) to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
        return text

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
