"""`finetune train ... --launcher ray --ray-address ADDR --devices N`: plan here, once, then run the plan's ranks
where the launcher places them (finetune/train/launchers.py), streaming their output to this terminal.

    finetune train data.jsonl --model M --out /shared/runs/one --devices 16 --launcher ray --ray-address HEAD:6379
    # plans as `finetune plan` does, writes OUT/launch-plan.json, then on the cluster, on each of 16 ranks:
    python -m finetune train --plan /shared/runs/one/launch-plan.json --out /shared/runs/one

With `--plan FILE` the given plan is executed as it is. SIGTERM or Ctrl-C stops every rank after the same step with a
checkpoint (exit 143 or 130); a second one kills them. `--resume` plans again and continues from the checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
from pathlib import Path

from finetune.run import RUN_FILES, plan_run
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.wording import ref
from finetune.train.launch import STOP_SIGNALS
from finetune.train.launchers import launcher_for
from finetune.train.trainer_run import Launcher, TrainerRun

PLAN_FILE = "launch-plan.json"


def train_on_launcher(args: argparse.Namespace, config: RunConfig, plan_file: str | None) -> int:
    """Run `finetune train` on the launcher `--launcher` names; the exit code of the whole run."""
    launcher = launcher_for(args.launcher, args.ray_address, args.placement_timeout)
    out = Path(config.out).resolve()
    path = Path(plan_file) if plan_file else plan_once(config, out, launcher)
    run = TrainerRun(path, out, config.resume, log=None, json=args.json, allow_changes=config.allow_changes)
    trainer = launcher.start(run)
    signals = {"count": 0}

    def on_signal(_signum, _frame) -> None:
        signals["count"] += 1
        if signals["count"] == 1:
            trainer.stop()  # every rank checkpoints after the same step and stops
        else:
            trainer.kill()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        while (code := trainer.wait(timeout=0.5)) is None:
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code  # a killed rank reads as a shell shows a killed process


def plan_once(config: RunConfig, out: Path, launcher: Launcher) -> Path:
    """Plan the run here (the test set held out into OUT, the data prepared) and write the plan the ranks execute."""
    taken = [name for name in RUN_FILES if (out / name).exists()]
    if taken and not config.resume:  # before planning writes anything into OUT
        raise UserError(
            f"{out} already holds a run ({', '.join(taken)}); pass {ref('resume')} to continue it, or choose "
            f"another {ref('out')}"
        )
    absolute = {
        name: str(Path(getattr(config, name)).resolve()) for name in ("data", "val_file") if getattr(config, name)
    }
    config = dataclasses.replace(config, out=str(out), **absolute)  # the same file from every node's working folder
    if config.gpu is None:
        config = dataclasses.replace(config, gpu=launcher.device_kind())  # estimates for the devices it runs on
    plan = plan_run(config, out).plan
    out.mkdir(parents=True, exist_ok=True)
    path = out / PLAN_FILE
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps(plan.to_dict(), indent=2), encoding="utf-8")
    partial.replace(path)
    return path
