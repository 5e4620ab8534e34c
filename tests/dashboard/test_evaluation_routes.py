"""The run page's Evaluate button, in process (no browser): what /v1/dashboard/jobs/{id}/run offers before an
evaluation starts (its estimate), the newest evaluation, and the test set's answers once one ran; and the wording
that points a dashboard reader at the button instead of at a command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import update  # noqa: E402

from finetune.report.diagnosis import REMINDER  # noqa: E402
from finetune.service.dashboard.app import create_app  # noqa: E402
from finetune.service.options import ServiceOptions  # noqa: E402
from finetune.service.storage.db import jobs  # noqa: E402
from finetune.settings.wording import act, render  # noqa: E402
from finetune.ship.eval.retention import remedies  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def app(tmp_path, toy_model):
    app = create_app(ServiceOptions(data_dir=tmp_path / "data", models={"toy": str(toy_model)}))
    app.state.test_keys = {tenant: app.state.store.create_key(tenant)[1] for tenant in ("alice", "bob")}
    yield app
    app.state.store.close()


def _client(app, tenant: str) -> TestClient:
    client = TestClient(app, base_url="http://127.0.0.1")
    client.headers["Authorization"] = f"Bearer {app.state.test_keys[tenant]}"
    return client


def _job(app, client: TestClient, succeeded: bool) -> tuple[str, Path]:
    upload = client.post("/v1/files", data={"purpose": "fine-tune"},
                         files={"file": ("train.jsonl", (EXAMPLES / "train.jsonl").read_bytes())})  # fmt: skip
    created = client.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": upload.json()["id"]})
    job_id = created.json()["id"]
    run = app.state.options.runs_dir / job_id
    (run / "adapter").mkdir(parents=True)
    cost = {"flops": 4e12, "seconds": 40.0, "devices": 1, "device": "cpu", "tokens_per_s": None}
    (run / "plan.json").write_text(json.dumps({"total_steps": 1, "memory": {"parameters": 1_000_000}, "cost": cost}))
    (run / "test.jsonl").write_text("".join((EXAMPLES / "train.jsonl").read_text().splitlines(keepends=True)[:4]))
    if succeeded:
        with app.state.store.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(status="succeeded"))
    return job_id, run


def test_the_run_offers_an_evaluation_with_its_estimate_then_shows_the_newest(app):
    alice = _client(app, "alice")
    job_id, run = _job(app, alice, succeeded=True)
    offer = alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()["evaluation"]
    assert offer["available"] and offer["retention"] and offer["test"]  # the run has a test set: both
    assert offer["estimate"]["seconds"] > 0 and offer["estimate"]["work"]["test"]["conversations"] == 4
    assert offer["latest"] is None
    started = alice.post(f"/v1/fine_tuning/jobs/{job_id}/evaluations", json={}).json()
    assert started["estimate_seconds"] == offer["estimate"]["seconds"]  # what the button showed is what it started
    again = alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()
    assert again["evaluation"]["latest"]["id"] == started["id"] and again["evaluation"]["latest"]["status"] == "queued"
    assert again["test_answers"] is None  # nothing answered yet

    example = {"line": 2, "prompt": "Where is my parcel?", "reference": "Hi there!", "answer": "Hi!", "base": "No.",
               "token_f1": 0.5}  # fmt: skip
    written = {"test_file": str(run / "test.jsonl"), "models": {"tuned": str(run)}, "examples": 4, "best": [example],
               "worst": [example], "rows": [example], "summary": {"tuned": {"token_f1": 0.5}}}  # fmt: skip
    (run / "eval.json").write_text(json.dumps(written))  # as the evaluation's `finetune eval` leaves it
    answers = alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()["test_answers"]
    assert answers["best"] == [example] and answers["summary"] == {"tuned": {"token_f1": 0.5}}
    assert "rows" not in answers and "test_file" not in answers and "models" not in answers  # no server path
    assert _client(app, "bob").get(f"/v1/dashboard/jobs/{job_id}/run").status_code == 404


def test_a_job_that_has_not_succeeded_is_not_offered_one(app):
    alice = _client(app, "alice")
    job_id, _ = _job(app, alice, succeeded=False)
    offer = alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()["evaluation"]
    assert offer["available"] is False and "only a succeeded job" in offer["reason"] and offer["latest"] is None


def test_advice_points_a_dashboard_reader_at_the_button_not_a_command(app):
    """Messages written for an API caller (a worker's trainer writes report.json and retention.json in API terms)
    name the evaluation route; the schema the dashboard reads maps that route to the page's own control, which its
    script (util.js inDashboardTerms) puts in its place."""
    actions = _client(app, "alice").get("/v1/fine_tuning/hyperparameters/schema").json()["actions"]
    reminder = render(REMINDER, "api")
    assert "finetune eval" not in reminder and actions["evaluate"]["api"] in reminder
    shown = reminder.replace(actions["evaluate"]["api"], actions["evaluate"]["dashboard"])
    assert "the Evaluate button on this run's page" in shown and "/v1/" not in shown
    remedy = render(remedies("lora")[0], "api")
    assert actions["compare_checkpoints"]["api"] in remedy and "--" not in remedy
    assert render(act("evaluate"), "cli") == "finetune eval"  # the command line's reader keeps the command
