"""Replies that state specifics their conversation never gave, in an uploaded file (docs/answers.md): the plan the API
answers and a job's events warn, counted by kind, lines named, the file named as uploaded; no value in any of them."""

from __future__ import annotations

import json

from fake_service import fake_launcher
from service_helpers import api_client

from finetune.service.workers.worker import Worker

ORDERS = ("BR-46304", "BR-22222")


def _upload(client, tmp_path) -> str:
    rows = [
        ("Where is my parcel?", "Your order BR-46304 is out for delivery."),  # line 1: an order never given
        ("Refund please.", "I refunded order BR-22222."),  # line 2
    ] + [(f"Where is order BR-{100000 + i}?", f"Order BR-{100000 + i} left our warehouse.") for i in range(14)]
    path = tmp_path / "support.jsonl"
    lines = [{"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]} for u, a in rows]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    answer = client.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": (path.name, path.read_bytes())})
    return answer.json()["id"]


def _body(file_id: str) -> dict:
    return {"model": "toy", "training_file": file_id, "method": {"type": "supervised", "supervised": {
        "hyperparameters": {"max_steps": 1, "val_fraction": 0}}}}  # fmt: skip


def _no_value(document) -> None:
    assert not any(order in json.dumps(document) for order in ORDERS)


def test_the_plan_and_the_job_s_events_warn_in_the_caller_s_terms(app, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    client = api_client(app, "alice")
    file_id = _upload(client, tmp_path)

    answer = client.post("/v1/fine_tuning/plan", json=_body(file_id))
    assert answer.status_code == 200, answer.text
    _no_value(answer.json())
    (warning,) = [w for w in answer.json()["warnings"] if w["code"] == "invented_specifics"]
    assert warning["message"].startswith("2 of 16 trained replies state 2 specifics the conversation never gave")
    assert "2 identifiers (order, ticket, account); support.jsonl lines 1, 2" in warning["message"]

    job = client.post("/v1/fine_tuning/jobs", json=_body(file_id)).json()["id"]
    assert Worker(app.state.options, app.state.store, launcher=fake_launcher()).run_once()
    events = client.get(f"/v1/fine_tuning/jobs/{job}/events", params={"limit": 100}).json()["data"]
    _no_value(events)
    (event,) = [e for e in events if e["message"].startswith("[invented_specifics]")]
    assert "support.jsonl lines 1, 2" in event["message"] and file_id not in event["message"]
