"""What every launcher is given and gives back: the run to start (TrainerRun), the Trainer it returns, the
Launcher protocol (launchers.py says where each runs), and die_with_parent for the processes they start."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from finetune.bucket.inputs import read_text
from finetune.settings.errors import UserError


@dataclass(frozen=True)
class TrainerRun:
    """One execution of a plan: what every launcher starts."""

    plan: Path | str  # a file, or an object of a bucket (s3://…)
    out: Path | str  # a folder, or a bucket's prefix (s3://…): the trainer writes it from wherever it runs
    resume: bool = False
    log: Path | None = None
    """The trainer's stdout and stderr, appended to this file; None: this process's own stdout and stderr."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to the trainer's environment (a Ray launcher adds it on every node)."""
    json: bool = True
    """`--json`: the report on stdout when the run ends."""
    allow_changes: str | None = None

    def args(self) -> list[str]:
        """`finetune`'s arguments that execute the plan."""
        args = ["train", "--plan", str(self.plan), "--out", str(self.out)]
        args += ["--json"] if self.json else []
        args += ["--resume"] if self.resume else []
        return args + (["--allow-changes", self.allow_changes] if self.allow_changes else [])

    def devices(self) -> int:
        """The processes the plan trains on (its `devices`)."""
        try:
            return int(json.loads(read_text(self.plan)).get("devices") or 1)
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.plan}: cannot read the plan ({exc})") from None


class Trainer(Protocol):
    waiting: str | None
    failure: str | None

    def wait(self, timeout: float | None = None) -> int | None: ...
    def stop(self) -> None: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    name: str

    def devices(self) -> int | None:
        """The most devices one run can have here (None: no limit, CPU processes share the cores)."""
        ...

    def device_kind(self) -> str | None:
        """The device the runs train on, as the plan's device table names it (None: unknown)."""
        ...

    def start(self, run: TrainerRun) -> Trainer: ...


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """In a child (preexec_fn): receive `sig` when the parent dies (Linux), so a killed worker never leaves a
    trainer writing on, and a killed `serve` never leaves its workers running. `parent`: the parent's pid, taken
    before the fork; a parent that died before the request was made (it then has another pid) sends `sig` now."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
