"""A job's `integrations` (OpenAI's wandb entry, our mlflow and tensorboard entries) become the run's --report-to:
mapped and checked with OpenAI-shaped 400s, echoed in the job object, and run by the worker with the credentials
of its own environment, which never appear in events, logs, the database or any answer of the API or dashboard."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from openai import OpenAI
from service_helpers import Server, free_port

from finetune.service.api.integrations import integrations_of, run_settings_for
from finetune.service.api_error import APIError

WANDB = {"type": "wandb", "wandb": {"project": "team-runs", "name": "nightly", "entity": "team", "tags": ["a", "b"]}}
MLFLOW = {"type": "mlflow", "mlflow": {"experiment": "service-runs", "run_name": "job-run"}}
TENSORBOARD = {"type": "tensorboard"}
SMALL = {"n_epochs": 1, "batch_size": 4, "max_seq_len": 256, "val_fraction": 0.25, "eval_every": 1}
# marker credentials in the worker's environment: none may come back anywhere
MARKERS = {
    "WANDB_API_KEY": "wandbmarker" + "0" * 29,  # W&B keys are 40 characters
    "MLFLOW_TRACKING_TOKEN": "mlflow-token-marker-7d1c",
    "MLFLOW_TRACKING_USERNAME": "mlflow-user-marker-52aa",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-password-marker-9b3e",
}


def test_integrations_map_to_report_to_and_back():
    settings = run_settings_for([WANDB, MLFLOW, TENSORBOARD])
    assert settings["report_to"] == "wandb,mlflow,tensorboard"
    assert json.loads(settings["tracker_options"]) == {
        "wandb": WANDB["wandb"], "mlflow": MLFLOW["mlflow"], "tensorboard": {}
    }  # fmt: skip
    assert integrations_of(settings) == [WANDB, MLFLOW, TENSORBOARD | {"tensorboard": {}}]
    assert run_settings_for(None) == {} and run_settings_for([]) == {} and integrations_of({}) == []
    # OpenAI's wandb entry with only its required project; name and entity may be null
    only = run_settings_for([{"type": "wandb", "wandb": {"project": "p", "name": None}}])
    assert integrations_of(only) == [{"type": "wandb", "wandb": {"project": "p"}}]


@pytest.mark.parametrize(
    ("integrations", "param", "words"),
    [
        ("wandb", "integrations", "a list of at most 5"),
        ([TENSORBOARD] * 6, "integrations", "a list of at most 5"),
        ([{"type": "neptune"}], "integrations[0].type", "one of tensorboard, mlflow, wandb"),
        ([TENSORBOARD, TENSORBOARD], "integrations[1].type", "more than one tensorboard"),
        ([{"type": "wandb", "wandb": {"name": "n"}}], "integrations[0].wandb.project", "is required"),
        ([{"type": "wandb", "wandb": {"project": "p", "api_key": "k"}}], "integrations[0].wandb.api_key", "no option"),
        ([{"type": "wandb", "wandb": {"project": "p", "tags": "t"}}], "integrations[0].wandb.tags", "list of at most"),
        ([{"type": "mlflow", "mlflow": {"tracking_uri": "http://evil"}}], "integrations[0].mlflow.tracking_uri", ""),
        ([{"type": "mlflow", "mlflow": {"experiment": 3}}], "integrations[0].mlflow.experiment", "must be text"),
        ([{"type": "tensorboard", "wandb": {}}], "integrations[0]", "unknown key(s) wandb"),
    ],
)
def test_a_bad_integration_is_a_400_naming_it(integrations, param, words):
    with pytest.raises(APIError) as err:
        run_settings_for(integrations)
    assert err.value.status == 400 and err.value.code == "invalid_value" and err.value.param == param
    assert words in err.value.message


def test_trackers_are_not_hyperparameters():
    from finetune.service.workers.library import SettingsError, settings_from_hyperparameters

    for key in ("report_to", "tracker_options"):
        with pytest.raises(SettingsError, match="unknown hyperparameter"):
            settings_from_hyperparameters({key: "tensorboard"})


# ----------------------------------------------------------------------------- end to end, with the openai SDK


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


@pytest.fixture(scope="module")
def tracked_service(tmp_path_factory, toy_model):
    """`finetune serve` whose worker has marker credentials, W&B offline, and an MLflow URI that nobody answers."""
    if not _installed("tensorboard", "wandb", "mlflow"):
        pytest.skip("finetune[tensorboard,wandb,mlflow] is not installed")
    root = tmp_path_factory.mktemp("tracked-svc")
    user, password = MARKERS["MLFLOW_TRACKING_USERNAME"], MARKERS["MLFLOW_TRACKING_PASSWORD"]
    env = dict(os.environ) | MARKERS | {
        "MLFLOW_TRACKING_URI": f"http://{user}:{password}@127.0.0.1:{free_port()}",  # a server that is down
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root / "wandb"),
        "WANDB_DATA_DIR": str(root / "wandb-data"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(root / "wandb-config"),
    }  # fmt: skip
    (root / "wandb").mkdir()
    server = Server(root / "data", toy_model, workers=1, extra=("--heartbeat-seconds", "0.5"), env=env)
    yield server, root
    server.stop()


def _wait_done(client: OpenAI, job_id: str, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} stuck at {job.status}")


def test_a_job_with_integrations_reaches_its_trackers_and_no_credential_leaks(tracked_service, tiny_data):
    server, root = tracked_service
    client = OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
    f = client.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    method = {"type": "supervised", "supervised": {"hyperparameters": SMALL}}
    with pytest.raises(openai.BadRequestError) as err:
        client.fine_tuning.jobs.create(model="toy", training_file=f.id, method=method,
                                       integrations=[{"type": "wandb", "wandb": {"name": "no project"}}])  # fmt: skip
    assert err.value.body["param"] == "integrations[0].wandb.project"

    created = client.fine_tuning.jobs.create(
        model="toy", training_file=f.id, seed=3, method=method, integrations=[WANDB, MLFLOW, TENSORBOARD]
    )
    assert [i.type for i in created.integrations] == ["wandb", "mlflow", "tensorboard"]
    assert created.integrations[0].wandb.project == "team-runs" and created.integrations[0].wandb.tags == ["a", "b"]
    job = _wait_done(client, created.id)
    assert job.status == "succeeded", job.error  # the MLflow server is down: the run went on without it
    rows = client.get(f"/fine_tuning/jobs/{job.id}/metrics", cast_to=object)["data"]
    assert len(rows) >= 2

    # TensorBoard: the run folder's event files hold every step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(root / "data" / "runs" / job.id / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars("train_loss")] == [
        (r["step"], r["train_loss"]) for r in rows
    ]

    # W&B (offline): a run named and tagged as the integration asked, with every step in its history
    (run_dir,) = (root / "wandb" / "wandb").glob("offline-run-*")
    records = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
                             capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    records = [json.loads(line) for line in records.splitlines() if line.strip()]
    run = next(r["run"] for r in records if r["type"] == "run")
    assert (run["display_name"], run["project"], run["entity"], run["tags"]) == (
        "nightly",
        "team-runs",
        "team",
        ["a", "b"],
    )
    assert [r["history"]["item"]["_step"] for r in records if r["type"] == "history"] == [r["step"] for r in rows]

    # MLflow (down): one warning in the job's log, without the credentials in its URL
    log_text = "".join(p.read_text(errors="replace") for p in (root / "data" / "logs").glob(f"{job.id}-*.log"))
    warnings = [line for line in log_text.splitlines() if line.startswith("--report-to mlflow")]
    assert len(warnings) == 1 and "training goes on without mlflow" in warnings[0], log_text[-3000:]
    assert "***@127.0.0.1" in warnings[0]

    # no marker anywhere: events, the job's logs, the database file, the API's and the dashboard's answers
    answers = [
        client.fine_tuning.jobs.retrieve(job.id).model_dump_json(),
        client.fine_tuning.jobs.list().model_dump_json(),
        client.fine_tuning.jobs.list_events(job.id, limit=100).model_dump_json(),
        client.fine_tuning.jobs.checkpoints.list(job.id).model_dump_json(),
        *(json.dumps(client.get(path, cast_to=object)) for path in (
            f"/fine_tuning/jobs/{job.id}/metrics", "/usage", f"/dashboard/progress?job_id={job.id}",
            f"/dashboard/jobs/{job.id}/curve", f"/dashboard/jobs/{job.id}/run",
        )),
    ]  # fmt: skip
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=10) as page:
        answers.append(page.read().decode(errors="replace"))
    places = {"API and dashboard answers": "\n".join(answers).encode(), "job logs": log_text.encode()}
    places["database file"] = b"".join(p.read_bytes() for p in (root / "data").glob("finetune.db*"))
    places["serve log"] = Path(server.log_path).read_bytes()
    run_folder = root / "data" / "runs"
    places["run folder and job config"] = b"".join(p.read_bytes() for p in run_folder.rglob("*") if p.is_file())
    places["W&B folder"] = b"".join(p.read_bytes() for p in (root / "wandb").rglob("*") if p.is_file())
    assert places["database file"] and b"team-runs" in places["database file"]  # the job's settings are in it
    for where, content in places.items():
        for name, marker in MARKERS.items():
            assert marker.encode() not in content, f"{name} found in the {where}"
