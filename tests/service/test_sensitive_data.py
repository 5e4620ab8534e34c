"""Sensitive data in an uploaded file (docs/sensitive-data.md): the worker's validation of the file reports the
counts as an event (warn), a job with `sensitive_data` refuse fails as the file's problem, the plan the API answers
says how many values `redact` replaced; no planted value is in any answer, event or job row."""

from __future__ import annotations

import json

from fake_service import fake_launcher
from planted_values import NEEDLES, holding, planted_rows
from service_helpers import api_client

from finetune.service.workers.worker import Worker

CARD, EMAIL, KEY = "4111 1111 1111 1111", "jane.doe@example.com", "AKIAIOSFODNN7EXAMPLE"


def _planted(tmp_path):
    rows = [
        ("My card is 4111 1111 1111 1111, mail me at jane.doe@example.com.", "I wrote to jane.doe@example.com."),
        ("The deploy fails.", "Use the key AKIAIOSFODNN7EXAMPLE for now."),
    ] + [(f"How do I reset router {i}?", f"Hold its reset button, router {i}.") for i in range(14)]
    path = tmp_path / "support.jsonl"
    lines = [{"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]} for u, a in rows]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _no_value(document) -> None:
    text = json.dumps(document)
    for value in (CARD, EMAIL, KEY):
        assert value not in text


def _job(client, file_id: str, **hyper) -> str:
    body = {"model": "toy", "training_file": file_id, "method": {"type": "supervised", "supervised": {
        "hyperparameters": {"max_steps": 1, "val_fraction": 0, **hyper}}}}  # fmt: skip
    response = client.post("/v1/fine_tuning/jobs", json=body)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def test_the_worker_s_validation_reports_counts_and_refuse_fails_the_job(app, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    client = api_client(app, "alice")
    upload = _planted(tmp_path)
    file_id = client.post(
        "/v1/files", data={"purpose": "fine-tune"}, files={"file": (upload.name, upload.read_bytes())}
    )
    file_id = file_id.json()["id"]
    warned, refused = _job(client, file_id), _job(client, file_id, sensitive_data="refuse")
    worker = Worker(app.state.options, app.state.store, launcher=fake_launcher())
    assert worker.run_once() and worker.run_once()

    events = client.get(f"/v1/fine_tuning/jobs/{warned}/events", params={"limit": 100}).json()["data"]
    _no_value(events)
    (found,) = [e for e in events if e["message"].startswith("support.jsonl: [sensitive_data]")]
    assert found["level"] == "warn" and "support.jsonl lines 1, 2" in found["message"]
    counts = found["data"]["sensitive_data"]
    assert counts["by_kind"] == {"card": 1, "email": 2, "secret": 1}
    assert counts["by_kind_and_role"]["email"] == {"user": 1, "assistant": 1}
    assert counts["files"] == {"support.jsonl": {"values": 4, "lines": [1, 2], "line_count": 2}}
    assert any(e["message"].startswith("[sensitive_data]") for e in events)  # and the plan's warning

    job = client.get(f"/v1/fine_tuning/jobs/{refused}").json()
    _no_value(job)
    assert job["status"] == "failed" and job["error"]["code"] == "invalid_training_file"
    assert "[sensitive_data]" in job["error"]["message"] and "4 values" in job["error"]["message"]
    assert "support.jsonl lines 1, 2" in job["error"]["message"]
    assert "hyperparameters.sensitive_data = redact" in job["error"]["message"]  # named as an API caller sets it


def test_the_plan_answer_says_how_many_values_redact_replaced(app, tmp_path):
    client = api_client(app, "alice")
    upload = _planted(tmp_path)
    file_id = client.post(
        "/v1/files", data={"purpose": "fine-tune"}, files={"file": (upload.name, upload.read_bytes())}
    )
    body = {"model": "toy", "training_file": file_id.json()["id"], "method": {"type": "supervised", "supervised": {
        "hyperparameters": {"sensitive_data": "redact"}}}}  # fmt: skip
    answer = client.post("/v1/fine_tuning/plan", json=body)
    assert answer.status_code == 200, answer.text
    _no_value(answer.json())
    (warning,) = [w for w in answer.json()["warnings"] if w["code"] == "sensitive_data"]
    assert warning["message"].startswith("4 sensitive value(s) replaced with placeholders before tokenizing")
    refused = client.post("/v1/fine_tuning/plan", json=body | {"method": {"type": "supervised", "supervised": {
        "hyperparameters": {"sensitive_data": "refuse"}}}})  # fmt: skip
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_training_file"
    _no_value(refused.json())


def test_a_redacted_job_leaves_no_planted_value_outside_the_uploads(app, tmp_path, monkeypatch):
    """Issue 42, through the API: ten kinds of values, `sensitive_data: redact`, a test split and replay on (the
    job's own general conversations); the real trainer runs the job to the end. No file under the data folder but
    the two uploads themselves (and no file of the cache root) holds a value, nor do the tokens trained on; the
    plan's event names the file as uploaded, with the upload's lines."""
    from finetune.data.tokenize import load_tokenizer

    cache = tmp_path / "cache"
    monkeypatch.setenv("FINETUNE_CACHE", str(cache))  # the trainer, a child process, inherits it
    client = api_client(app, "alice")
    uploads = {}
    for name, rows in (("support.jsonl", planted_rows(3, 12)), ("general.jsonl", planted_rows(1, 6))):
        content = "".join(json.dumps(row) + "\n" for row in rows).encode()
        answer = client.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": (name, content)})
        uploads[name] = answer.json()["id"]
    hyper = {"sensitive_data": "redact", "test_fraction": 0.2, "general_data": uploads["general.jsonl"],
             "val_fraction": 0.2, "max_steps": 2, "batch_size": 4}  # fmt: skip
    body = {"model": "toy", "training_file": uploads["support.jsonl"],
            "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}}}  # fmt: skip
    job_id = client.post("/v1/fine_tuning/jobs", json=body).json()["id"]
    options = app.state.options
    assert Worker(options, app.state.store).run_once()  # the real trainer
    job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    run = options.runs_dir / job_id
    assert (run / "test.jsonl").is_file() and (run / "replay" / "train.jsonl").is_file()

    found = holding([options.data_dir, cache], load_tokenizer(str(app.state.options.models["toy"])))
    own_uploads = {str(options.files_dir / file_id) for file_id in uploads.values()}
    assert {kind: sorted(set(files) - own_uploads) for kind, files in found.items()} == {k: [] for k in NEEDLES}
    events = client.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 100}).json()["data"]
    (planned,) = [e["message"] for e in events if e["message"].startswith("[sensitive_data]")]
    assert "support.jsonl lines" in planned and "general.jsonl lines" in planned and "train.jsonl" not in planned


def test_the_plans_redaction_event_names_the_upload_and_its_lines_not_the_runs_copy(app, tmp_path, monkeypatch):
    """Issue 42: with a test split held out, the plan's event named the job's internal copy ("train.jsonl lines
    1…9") where the plan of the same body named the upload: it names the file as uploaded, by the upload's lines."""
    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    client = api_client(app, "alice")
    upload = _planted(tmp_path)
    file_id = client.post(
        "/v1/files", data={"purpose": "fine-tune"}, files={"file": (upload.name, upload.read_bytes())}
    ).json()["id"]
    hyper = {"max_steps": 1, "val_fraction": 0, "sensitive_data": "redact", "test_fraction": 0.25}
    body = {"model": "toy", "training_file": file_id, "seed": 9,  # holds out line 1: line 2 is the copy's line 1
            "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}}}  # fmt: skip
    job_id = client.post("/v1/fine_tuning/jobs", json=body).json()["id"]
    assert Worker(app.state.options, app.state.store, launcher=fake_launcher()).run_once()
    held = json.loads((app.state.options.runs_dir / job_id / "test_split.json").read_text())["lines"]
    kept = [line for line in (1, 2) if line not in held]  # the planted lines that stayed in training
    assert kept, "the seed must keep a planted line in training"
    events = client.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 100}).json()["data"]
    (planned,) = [e["message"] for e in events if e["message"].startswith("[sensitive_data]")]
    lines = f"support.jsonl line{'s' * (len(kept) > 1)} {', '.join(map(str, kept))};"
    assert lines in planned and "train.jsonl" not in planned and "file-" not in planned, planned
    _no_value(events)
