"""What a person sees while a run trains: the plan, a progress bar on a terminal (plain log lines
otherwise), and the run's notes. The library call shows none of it; `RunDisplay` is what the command
line (and the demo) pass as the run's callbacks. Everything goes to one stream (stderr for
`finetune train`), never hard-wrapped when it is not a terminal.

The progress reads the loop's per-step metrics row (step, epoch, learning_rate, train_loss, tokens_per_s, val_loss).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, TextIO

from finetune.plan.render import render_plan

if TYPE_CHECKING:
    from rich.console import Console

    from finetune.plan.plan import Plan

PLAIN_LINES_PER_RUN = 50  # a log file gets about this many lines, plus one per evaluation


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressReporter:
    """Call with each metrics row; use as a context manager around the loop."""

    def __init__(self, total_steps: int, first_step: int = 0, stream: TextIO | None = None) -> None:
        self.total = total_steps
        self.first = first_step
        self.stream = stream or sys.stderr
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
            f"epoch {row['epoch']:.2f}  loss {row['train_loss']:.4f}  lr {row['learning_rate']:.2e}  "
            f"{row['tokens_per_s']:,.0f} tok/s"
        )
        if "val_loss" in row and row["val_loss"] is not None:
            status += f"  val {row['val_loss']:.4f}"
        if row.get("general_val_loss") is not None:  # the forgetting curve (general_val)
            status += f"  general {row['general_val_loss']:.4f}"
        if self._progress is not None:
            self._progress.update(self._task, completed=row["step"], status=status)
            return
        step = row["step"]
        if step % self.every == 0 or step == self.total or "val_loss" in row or "general_val_loss" in row:
            line = f"step {step}/{self.total}  {status}  eta {_duration(self._eta(step))}"
            print(line, file=self.stream, flush=True)


def console_for(stream: TextIO) -> Console:
    """A rich console on `stream`: the terminal's width on a terminal; unwrapped lines in a pipe or file."""
    from rich.console import Console

    if stream.isatty():
        return Console(file=stream, highlight=False)
    return Console(file=stream, highlight=False, width=1000, soft_wrap=True)


class RunDisplay:
    """The run's callbacks for a person: `on_plan` prints the plan and starts the progress, `on_step`
    advances it; notes of the `finetune` logger are printed too. Use as a context manager around the run."""

    def __init__(self, stream: TextIO | None = None, first_step: int = 0) -> None:
        self.stream = stream or sys.stderr
        self.first_step = first_step
        self.console = console_for(self.stream)
        self._progress: ProgressReporter | None = None
        self._handler = logging.StreamHandler(self.stream)
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def __enter__(self) -> RunDisplay:
        logger = logging.getLogger("finetune")
        logger.addHandler(self._handler)
        logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
        logging.getLogger("finetune").removeHandler(self._handler)

    def on_plan(self, plan: Plan) -> None:
        render_plan(plan, console=self.console)
        self._progress = ProgressReporter(plan.total_steps, self.first_step, self.stream).__enter__()

    def on_step(self, row: dict) -> None:
        if self._progress is not None:
            self._progress(row)
