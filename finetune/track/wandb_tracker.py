"""--report-to wandb: a Weights & Biases run, configured by W&B's own environment (WANDB_API_KEY, WANDB_MODE=offline,
WANDB_BASE_URL, WANDB_DIR, ...) and --tracker-options wandb.{project, name, entity, tags} (else WANDB_PROJECT,
else "finetune"; the run is named after the out folder unless WANDB_NAME or the option names it). Its files go
to $WANDB_DIR, else to the out folder (OUT/wandb/).

Config: the plan (Auto's values, and `auto`: its reasons). History: every field of metrics.jsonl at its step.
At the end: report.json, loss_curve.png and the model card as one artifact (type "finetune-run"), and the
report's diagnosis in the summary. W&B's console capture is off: the run's output stays as finetune prints it.
"""

from __future__ import annotations

import os
import re

from finetune.track.tracker import Outputs, RunInfo, Step

DEFAULT_PROJECT = "finetune"
ARTIFACT_TYPE = "finetune-run"
# W&B's own process (wandb-core) retries its server for minutes, and the end of the process waits for it: a server
# that is down would hold the run's end that long. These cap it; W&B reads them from the environment, and they
# apply only where the user has not set them.
QUICK_FAILURE = {
    "WANDB_HTTP_TIMEOUT": "10",
    "WANDB__GRAPHQL_RETRY_MAX": "2",
    "WANDB__FILE_STREAM_RETRY_MAX": "3",
    "WANDB__FILE_STREAM_TIMEOUT_SECONDS": "10",
    "WANDB__FILE_TRANSFER_RETRY_MAX": "3",
}


class WandbTracker:
    name = "wandb"

    def __init__(self) -> None:
        for name, value in QUICK_FAILURE.items():  # on the caller's thread: os.environ is not changed concurrently
            os.environ.setdefault(name, value)
        self.run = None
        self.artifact_name = ""

    def start(self, run: RunInfo) -> None:
        import wandb

        options = run.options
        name = options.get("name") or os.environ.get("WANDB_NAME") or run.name
        self.run = wandb.init(
            project=options.get("project") or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            entity=options.get("entity"),  # None: WANDB_ENTITY, else the account's default
            name=name,
            tags=options.get("tags"),  # None: WANDB_TAGS
            dir=None if os.environ.get("WANDB_DIR") else str(run.out),
            config=run.plan,
            reinit="create_new",  # its own run object: nothing global of wandb's is used or changed
            settings=wandb.Settings(console="off", silent=True),
        )
        self.artifact_name = re.sub(r"[^A-Za-z0-9._-]", "-", name)

    def log_steps(self, steps: list[Step]) -> None:
        for step in steps:
            self.run.log({**step.metrics, **step.notes}, step=step.step)

    def finish(self, outputs: Outputs) -> None:
        import wandb

        if outputs.files:
            artifact = wandb.Artifact(self.artifact_name, type=ARTIFACT_TYPE)
            for path, folder in outputs.files:
                artifact.add_file(str(path), name=f"{folder}/{path.name}" if folder else path.name)
            self.run.log_artifact(artifact)
        diagnosis = (outputs.report.get("diagnosis") or {}).get("kind")
        if diagnosis:
            self.run.summary["diagnosis"] = diagnosis
        self.run.finish(exit_code=0 if outputs.ok else 1)
