"""`finetune train`: one run, here or where it is asked to run; plan, progress and summary on stderr, and with --json
the report (report.json's content) on stdout.

    finetune train data.jsonl --model M --out OUT                 in this process
    finetune train data.jsonl --model M --out OUT --devices 2     that many local processes, through torchrun (launch.py)
    finetune train --plan PLAN.json --out OUT                     a plan made elsewhere (`finetune plan --json`, a job)

`--launcher ray --ray-address ADDR --devices N`: plan here, once, then run the plan's ranks where the launcher places
them (finetune/train/launchers.py), streaming their output to this terminal.

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
import os
import signal
import sys
from pathlib import Path

from finetune.bucket.uri import is_remote
from finetune.commands.bucket_plan import plan_into_bucket
from finetune.commands.flags import _config_from_args
from finetune.models.source import resolve_model
from finetune.plan.plan import Plan
from finetune.report.summary import print_summary
from finetune.run import RUN_FILES, load_plan, plan_run, train
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.registry import settings
from finetune.settings.wording import ref
from finetune.train.checkpoint import list_checkpoints
from finetune.train.distributed import launched_by_torchrun
from finetune.train.launch import STOP_SIGNALS, launch_local
from finetune.train.launchers import launcher_for
from finetune.train.loop import TrainingInterrupted
from finetune.train.progress import RunDisplay, console_for
from finetune.train.trainer_run import Launcher, TrainerRun

PLAN_FILE = "launch-plan.json"


def run_train(args: argparse.Namespace) -> int:
    """`finetune train`: the exit code of the whole run, wherever its processes ran."""
    plan = None
    if args.plan:
        config, plan = config_of_plan(args)
    else:
        config = _config_from_args(args, data=getattr(args, "data", None), command="train")
    if (args.launcher != "local" or args.ray_address or args.placement_timeout) and not launched_by_torchrun():
        return train_on_launcher(args, config, args.plan)  # plans here once, then runs the ranks where it places them
    if config.devices > 1 and not launched_by_torchrun():
        resolve_model(config.model)  # a GGUF file converts here, once, not in every process the launch starts
        return launch_local(config.devices, sys.argv[1:])
    return train_here(config, plan, args.json)


def train_here(config: RunConfig, plan: Plan | None, as_json: bool) -> int:
    """This process's run (one of torchrun's ranks, or the only one); rank 0 shows the plan, progress and summary."""
    main_rank = int(os.environ.get("RANK", "0")) == 0
    found = list_checkpoints(Path(config.out)) if config.resume else []
    first_step = int(found[-1].name.split("-")[-1]) if found else 0
    try:
        if main_rank:
            with RunDisplay(sys.stderr, first_step) as display:
                result = train(config, on_plan=display.on_plan, on_step=display.on_step, plan=plan)
        else:
            result = train(config, plan=plan)
    except TrainingInterrupted as stop:
        if main_rank:  # every rank stops; one message is enough
            print(f"error: {stop}", file=sys.stderr)
        return 128 + stop.signum
    if result.report:
        if as_json:
            print(json.dumps(result.report, indent=2))
        else:
            print_summary(result.report, console=console_for(sys.stderr))
    return 0


def config_of_plan(args: argparse.Namespace) -> tuple[RunConfig, Plan]:
    """`finetune train --plan FILE --out DIR [--resume]`: the plan holds every setting; only a run's own are given."""
    own = {"out", "resume", "allow_changes"}
    given = sorted(k for k in vars(args) if k in {s.name for s in settings()} - own)
    if given or getattr(args, "data", None) or args.config:
        flags = ", ".join(
            ["--" + k.replace("_", "-") for k in given] + (["DATA"] if getattr(args, "data", None) else [])
        )
        raise UserError(
            f"--plan holds every setting of the run: drop {flags or '--config'} (only --out and --resume go with it)"
        )
    if not getattr(args, "out", None):
        raise UserError("--plan needs --out DIR: the folder the run writes")
    plan = load_plan(args.plan, args.out, getattr(args, "resume", False), getattr(args, "allow_changes", None))
    return plan.run, plan


def train_on_launcher(args: argparse.Namespace, config: RunConfig, plan_file: str | None) -> int:
    """Run `finetune train` on the launcher `--launcher` names; the exit code of the whole run."""
    launcher = launcher_for(args.launcher, args.ray_address, args.placement_timeout)
    if is_remote(config.out):  # nodes that share no folder: the plan, its inputs and the run go through the bucket
        out, path = config.out, plan_file or plan_into_bucket(config, launcher)
    else:
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
