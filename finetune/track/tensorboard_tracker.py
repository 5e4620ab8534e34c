"""--report-to tensorboard: event files in OUT/tensorboard/, or $FINETUNE_TENSORBOARD_DIR/<run name>/.

Each metric of metrics.jsonl is a scalar at its step; the plan's settings are the run's hyperparameters (the
HParams tab) and a text table; at the end, report.json and the model card are text, loss_curve.png an image
(its PNG bytes as written). Uses torch's SummaryWriter, which needs the `tensorboard` package.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from finetune.track.tracker import Outputs, RunInfo, Step

DIR_ENV = "FINETUNE_TENSORBOARD_DIR"


def log_dir(run: RunInfo) -> Path:
    root = os.environ.get(DIR_ENV)
    return Path(root) / run.name if root else run.out / "tensorboard"


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self) -> None:
        self.writer = None
        self.resumed = False

    def start(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.writer = SummaryWriter(log_dir=str(log_dir(run)), flush_secs=10)
        self.resumed = run.resumed
        params = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in run.params.items()}
        for summary in hparams(params, {}):  # experiment, session start, session end: the HParams tab
            self.writer.file_writer.add_summary(summary)
        table = "\n".join(f"| {k} | {str(v).replace('|', '/')} |" for k, v in params.items())
        self.writer.add_text("plan", "| setting | value |\n|---|---|\n" + table, 0)

    def log_steps(self, steps: list[Step]) -> None:
        if self.resumed:  # a resumed run logs again from its checkpoint: readers drop the older events past it
            self._purge_from(steps[0].step)
            self.resumed = False
        for step in steps:
            for name, value in step.metrics.items():
                self.writer.add_scalar(name, value, step.step, walltime=step.time)
            for name, text in step.notes.items():
                self.writer.add_text(name, text, step.step, walltime=step.time)

    def _purge_from(self, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.writer.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))

    def finish(self, outputs: Outputs) -> None:
        last = _last_step(outputs.report)
        for path, folder in outputs.files:
            if path.suffix == ".png":
                self.writer.file_writer.add_summary(_png_summary(path.stem, path.read_bytes()), last)
            elif path.suffix == ".json":
                text = json.dumps(json.loads(path.read_text(encoding="utf-8")), indent=2)
                self.writer.add_text(path.stem, "```\n" + text + "\n```", last)
            else:  # the model card, markdown
                self.writer.add_text(f"{folder}/{path.stem}" if folder else path.stem, path.read_text("utf-8"), last)
        self.writer.close()


def _last_step(report: dict) -> int:
    return int(report.get("steps_taken") or 0)


def _png_summary(tag: str, png: bytes):
    """An image summary holding the PNG file's own bytes (width and height from its IHDR header)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    width, height = struct.unpack(">II", png[16:24])
    image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=png)
    return Summary(value=[Summary.Value(tag=tag, image=image)])
