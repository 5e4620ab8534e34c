"""What the user sees while a run trains: a progress bar on a terminal, plain log lines otherwise.

Both read the loop's per-step metrics row (step, epoch, lr, train_loss, tokens_per_s, val_loss).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

PLAIN_LINES_PER_RUN = 50  # a log file gets about this many lines, plus one per evaluation


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressReporter:
    """Call with each metrics row; use as a context manager around the loop."""

    def __init__(self, total_steps: int, first_step: int = 0, stream: TextIO | None = None) -> None:
        self.total = total_steps
        self.first = first_step
        self.stream = stream or sys.stdout
        self.every = max(1, total_steps // PLAIN_LINES_PER_RUN)
        self.started = time.perf_counter()
        self._progress = None
        self._task = None

    def __enter__(self) -> ProgressReporter:
        self.started = time.perf_counter()
        if self.stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[status]}"),
                TextColumn("eta"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.total, completed=self.first, status="")
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _eta(self, step: int) -> float:
        done = step - self.first
        return (time.perf_counter() - self.started) / done * (self.total - step) if done else 0.0

    def __call__(self, row: dict) -> None:
        status = (
            f"epoch {row['epoch']:.2f}  loss {row['train_loss']:.4f}  lr {row['lr']:.2e}  "
            f"{row['tokens_per_s']:,.0f} tok/s"
        )
        if "val_loss" in row and row["val_loss"] is not None:
            status += f"  val {row['val_loss']:.4f}"
        if self._progress is not None:
            self._progress.update(self._task, completed=row["step"], status=status)
            return
        step = row["step"]
        if step % self.every == 0 or step == self.total or "val_loss" in row:
            line = f"step {step}/{self.total}  {status}  eta {_duration(self._eta(step))}"
            print(line, file=self.stream, flush=True)
