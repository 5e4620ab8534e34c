"""`finetune train`: the command-line face of run_training (printing, exit codes, multi-device launch)."""

from __future__ import annotations

import os
import sys

from finetune.config import RunConfig
from finetune.train.distributed import launched_by_torchrun


def run_train(config: RunConfig) -> int:
    if config.devices > 1 and not launched_by_torchrun():
        from finetune.train.launch import launch_local

        return launch_local(config.devices, sys.argv[1:])

    from finetune.report.summary import print_summary
    from finetune.train.loop import TrainingInterrupted
    from finetune.train.run import run_training

    try:
        report = run_training(config)
    except TrainingInterrupted as stop:
        if int(os.environ.get("RANK", "0")) == 0:  # every rank stops; one message is enough
            print(f"error: {stop}", file=sys.stderr)
        return 128 + stop.signum
    if report:
        print_summary(report)
    return 0
