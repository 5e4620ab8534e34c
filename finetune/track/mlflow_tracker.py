"""--report-to mlflow: a run in the MLflow tracking server of $MLFLOW_TRACKING_URI (MLflow's own default, a local
./mlflow.db, when unset), in experiment --tracker-options mlflow.experiment, else $MLFLOW_EXPERIMENT_NAME, else
"finetune"; the run is named after the out folder (or mlflow.run_name).

Parameters: the plan's settings with Auto's values and `auto.<setting>` (Auto's reason). Metrics: every number
of metrics.jsonl at its step (the loss-spike warning as a tag `warning.step_<N>`). Artifacts: report.json,
loss_curve.png and the model card (adapter/README.md or model/README.md). Credentials are MLflow's own
environment variables (MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME/PASSWORD, ...), read by its client.
"""

from __future__ import annotations

import os

from finetune.track.tracker import Outputs, RunInfo, Step

DEFAULT_EXPERIMENT = "finetune"
# MLflow's client retries a request for minutes by default (7 retries, backoff factor 2, 120 s timeout): a
# server that is down would hold this tracker's thread, and so the run's end, for that long. These apply to the
# whole process (MLflow reads them at each request) and only where the user has not set them.
QUICK_FAILURE = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # its "View run at" lines would break `train --json`'s stdout
}
PARAMS_PER_CALL = 100  # MLflow's limits of one log_batch call
ENTITIES_PER_CALL = 1000
MAX_PARAM_LENGTH = 6000


class MlflowTracker:
    name = "mlflow"

    def __init__(self) -> None:
        for name, value in QUICK_FAILURE.items():  # on the caller's thread: os.environ is not changed concurrently
            os.environ.setdefault(name, value)
        self.client = None
        self.run_id: str | None = None

    def start(self, run: RunInfo) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = MlflowClient()
        experiment = run.options.get("experiment") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        tags = {"finetune.resumed": "true"} if run.resumed else {}
        created = self.client.create_run(
            self._experiment_id(experiment), run_name=run.options.get("run_name") or run.name, tags=tags
        )
        self.run_id = created.info.run_id
        params = [Param(key, _param_value(value)) for key, value in run.params.items()]
        for i in range(0, len(params), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_CALL], synchronous=True)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another run created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log_steps(self, steps: list[Step]) -> None:
        from mlflow.entities import Metric, RunTag

        metrics = [
            Metric(name, value, int(step.time * 1000), step.step)
            for step in steps
            for name, value in step.metrics.items()
        ]
        tags = [RunTag(f"{name}.step_{step.step}", text) for step in steps for name, text in step.notes.items()]
        for i in range(0, len(metrics), ENTITIES_PER_CALL):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + ENTITIES_PER_CALL], synchronous=True)
        for i in range(0, len(tags), PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, tags=tags[i : i + PARAMS_PER_CALL], synchronous=True)

    def finish(self, outputs: Outputs) -> None:
        for path, folder in outputs.files:
            self.client.log_artifact(self.run_id, str(path), folder or None)
        diagnosis = (outputs.report.get("diagnosis") or {}).get("kind")
        if diagnosis:
            self.client.set_tag(self.run_id, "finetune.diagnosis", diagnosis)
        self.client.set_terminated(self.run_id, "FINISHED" if outputs.ok else "FAILED")


def _param_value(value) -> str:
    text = str(value)
    return text if len(text) <= MAX_PARAM_LENGTH else text[: MAX_PARAM_LENGTH - 1] + "…"
