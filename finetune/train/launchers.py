"""Where a planned run's trainer runs: on this machine (`local`, the default) or on a Ray cluster (`ray`).

The service's worker and `finetune train --launcher ray` go through one seam:

    trainer = launcher.start(TrainerRun(plan, out, resume, log, env))
    trainer.wait(timeout)   # the exit code once it has ended, None while it runs
    trainer.stop()          # SIGTERM to every process: each checkpoints at the step boundary and exits 143
    trainer.kill()          # now, without a checkpoint; returns once every process is gone
    trainer.waiting         # what the run waits for now, in a sentence (a Ray cluster's free devices), or None
    trainer.failure         # why the launcher itself ended the run (the ranks were never placed), or None

Every launcher runs the same program, `python -m finetune train --plan PLAN --out OUT [--resume]`: its checkpoints,
its SIGTERM handling and its bit-identical resume do not depend on where it runs. Exit codes read like
subprocess.Popen's: 0, the trainer's own code (1: an error it explained; 143: stopped by SIGTERM), or minus a
signal's number for a process that was killed (a Ray rank whose process or node was lost reads as -SIGKILL).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from finetune.settings.errors import UserError

LAUNCHERS = ("local", "ray")
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable: `--ray-address` defaults to it


@dataclass(frozen=True)
class TrainerRun:
    """One execution of a plan: what every launcher starts."""

    plan: Path
    out: Path
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
            return int(json.loads(self.plan.read_text(encoding="utf-8")).get("devices") or 1)
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


def launcher_for(name: str, ray_address: str | None = None, placement_timeout: float | None = None) -> Launcher:
    """The launcher `--launcher NAME [--ray-address ADDR] [--placement-timeout SECONDS]` asks for."""
    if name == "local":
        for flag, given in (("--ray-address", ray_address), ("--placement-timeout", placement_timeout)):
            if given:
                raise UserError(f"{flag} goes with --launcher ray; drop it, or add --launcher ray")
        return LocalLauncher()
    if name == "ray":
        from finetune.train.ray_launch import RayLauncher

        return RayLauncher(ray_address, placement_timeout)
    raise UserError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {name!r}")


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """In a child (preexec_fn): receive `sig` when the parent dies (Linux), so a killed worker never leaves a
    trainer writing on, and a killed `serve` never leaves its workers running. `parent`: the parent's pid, taken
    before the fork; a parent that died before the request was made (it then has another pid) sends `sig` now."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


# ----------------------------------------------------------------------------- local: a child process


class LocalLauncher:
    """`python -m finetune train --plan ...` as a child of this process; with `devices` above 1 that command starts
    torchrun's processes on this machine itself (launch.py)."""

    name = "local"

    def __init__(self, program: list[str] | None = None) -> None:
        self.program = program or [sys.executable, "-m", "finetune"]

    def devices(self) -> int | None:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else None

    def device_kind(self) -> str:
        from finetune.train.speed import local_device_kind

        return local_device_kind()

    def start(self, run: TrainerRun) -> LocalTrainer:
        log = open(run.log, "ab") if run.log else None  # noqa: SIM115 (the child holds its own copy; closed below)
        try:
            child = subprocess.Popen(
                [*self.program, *run.args()],
                env={**os.environ, **run.env},
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
                start_new_session=True,  # a Ctrl-C at the caller's terminal is the caller's to handle
            )
        finally:
            if log:
                log.close()
        return LocalTrainer(child)


class LocalTrainer:
    waiting = failure = None  # a child process starts at once, and ends by itself

    def __init__(self, child: subprocess.Popen) -> None:
        self.child = child

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)  # the trainer saves a checkpoint at the step boundary

    def kill(self) -> None:
        self.child.kill()
        self.child.wait()
