"""Where a planned run's trainer runs: on this machine (`local`, the default) or on a Ray cluster (`ray`).

The service's worker and `finetune train --launcher ray` go through one seam (its types: trainer_run.py):

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

import os
import signal
import subprocess
import sys

from finetune.settings.errors import UserError
from finetune.train.speed import local_device_kind, no_gpu_here
from finetune.train.trainer_run import Launcher, TrainerRun, die_with_parent

LAUNCHERS = ("local", "ray")


def launcher_for(name: str, ray_address: str | None = None, placement_timeout: float | None = None) -> Launcher:
    """The launcher `--launcher NAME [--ray-address ADDR] [--placement-timeout SECONDS]` asks for."""
    if name == "local":
        for flag, given in (("--ray-address", ray_address), ("--placement-timeout", placement_timeout)):
            if given:
                raise UserError(f"{flag} goes with --launcher ray; drop it, or add --launcher ray")
        return LocalLauncher()
    if name == "ray":
        # ray (an optional extra) and torch (train.launch): the command line's parser imports this module without them
        from finetune.train.ray_launch import RayLauncher

        return RayLauncher(ray_address, placement_timeout)
    raise UserError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {name!r}")


# ----------------------------------------------------------------------------- local: a child process


class LocalLauncher:
    """`python -m finetune train --plan ...` as a child of this process; with `devices` above 1 that command starts
    torchrun's processes on this machine itself (launch.py)."""

    name = "local"

    def __init__(self, program: list[str] | None = None) -> None:
        self.program = program or [sys.executable, "-m", "finetune"]

    def devices(self) -> int | None:
        if no_gpu_here():  # known without torch: a service worker on a CPU machine never imports it
            return None
        import torch  # torch: only to count the GPUs a driver says are there

        return torch.cuda.device_count() if torch.cuda.is_available() else None

    def device_kind(self) -> str:
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
