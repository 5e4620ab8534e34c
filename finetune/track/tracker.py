"""What a tracker is and what it is handed: a class with `start(run)`, `log_steps(steps)` and `finish(outputs)`
(tensorboard_tracker.py, mlflow_tracker.py, wandb_tracker.py), run by base.py on its own thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class RunInfo:
    """What a tracker needs to open its run."""

    name: str  # the out folder's name: the run's name in every tracker unless an option names it
    out: Path
    params: dict[str, Any]  # the plan, flattened: "memory.total", "auto.learning_rate" (Auto's reason), ...
    plan: dict[str, Any]  # plan.json's content, nested
    options: dict[str, Any] = field(default_factory=dict)  # this tracker's --tracker-options
    resumed: bool = False


@dataclass
class Step:
    """One metrics row, split the way trackers take it."""

    step: int
    time: float  # when the loop logged it (seconds since the epoch)
    metrics: dict[str, float]  # every number of the row but `step`
    notes: dict[str, str]  # anything else (e.g. the loss-spike warning)


@dataclass
class Outputs:
    """The run's end: its files (path, folder in the tracker's artifacts) and report.json's content."""

    files: list[tuple[Path, str]]
    report: dict
    ok: bool  # False: the run stopped before its end


class Tracker(Protocol):
    name: str

    def start(self, run: RunInfo) -> None: ...

    def log_steps(self, steps: list[Step]) -> None: ...

    def finish(self, outputs: Outputs) -> None: ...
