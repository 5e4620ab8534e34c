"""A job's own general conversations for self-replay (`general_data`) through the API: the caller names a file it
uploaded by its id, exactly as validation_file, never a path on the server. The job keeps the id (jobs.general_data_file),
shows it in its hyperparameters, and its worker gives the run the stored upload; the file is in use while the job has
not ended. The worker tests use the stand-in trainer (fake_trainer.py): the real validation and plan, no training."""

from __future__ import annotations

import json
import tempfile
import time

import pytest
from fake_service import fake_launcher
from openai import OpenAI
from service_helpers import LOOPBACK, api_client

from finetune.service.storage import tombstones
from finetune.service.storage.db import JOB_FILE_COLUMNS, jobs
from finetune.service.workers import library as core
from finetune.service.workers.worker import Worker

PARAM = "hyperparameters.general_data"
MARKER = "GENERAL-ONLY-8812"
ONE_STEP = {"max_steps": 1, "val_fraction": 0}


def _general(n: int = 6, marker: str = MARKER) -> bytes:
    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} plus {i}? {marker}"},
                      {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]}
        for i in range(1, n + 1)
    ]  # fmt: skip
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _upload(client, content: bytes, name: str, purpose: str = "fine-tune") -> str:
    answer = client.post("/v1/files", files={"file": (name, content)}, data={"purpose": purpose})
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def _body(training: str, hyper: dict) -> dict:
    return {"model": "toy", "training_file": training,
            "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}}}  # fmt: skip


@pytest.fixture
def files(app, tiny_data) -> dict[str, str]:
    """alice's training file and general conversations, bob's general conversations."""
    alice, bob = api_client(app), api_client(app, "bob")
    return {
        "training": _upload(alice, tiny_data.read_bytes(), "support.jsonl"),
        "general": _upload(alice, _general(), "general.jsonl"),
        "bobs": _upload(bob, _general(), "general.jsonl"),
    }


def test_the_sdk_creates_a_job_with_its_general_conversations_by_file_id(app, files):
    client = OpenAI(base_url=f"{LOOPBACK}/v1", api_key=app.state.test_keys["alice"], http_client=api_client(app))
    method = {
        "type": "supervised",
        "supervised": {"hyperparameters": {"general_data": files["general"], "n_epochs": 1}},
    }
    job = client.fine_tuning.jobs.create(model="toy", training_file=files["training"], method=method)
    assert job.status == "queued"
    assert job.to_dict()["hyperparameters"]["general_data"] == files["general"]  # as the caller sent it
    assert job.to_dict()["method"]["supervised"]["hyperparameters"]["general_data"] == files["general"]
    row = app.state.store.get_job("alice", job.id)
    assert row["general_data_file"] == files["general"]
    assert "general_data" not in row["run_settings"]  # the worker gives the run the stored upload's path


@pytest.mark.parametrize("route", ["/v1/fine_tuning/jobs", "/v1/fine_tuning/plan"])
def test_a_missing_foreign_results_or_path_general_data_is_refused(app, files, route):
    alice, store, options = api_client(app), app.state.store, app.state.options
    (options.files_dir / "file-results").write_text("step,train_loss\n1,1.0\n")
    store.add_file("alice", "file-results", "step_metrics.csv", "fine-tune-results", 22)
    refused = {
        "file-nope": "Could not find file 'file-nope'.",
        files["bobs"]: f"Could not find file {files['bobs']!r}.",  # another tenant's reads like a missing one
        "/etc/passwd": "Could not find file '/etc/passwd'.",  # a path is never read: it is no file id
        str(options.files_dir / files["general"]): "Could not find file",  # not even a stored upload's path
        "file-results": "is a job's results file",
    }
    for value, message in refused.items():
        answer = alice.post(route, json=_body(files["training"], {"general_data": value}))
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_hyperparameters", PARAM), value
        assert message in error["message"]
    assert alice.get("/v1/fine_tuning/jobs").json()["data"] == []


def test_general_data_without_replay_is_refused_in_api_terms(app, files):
    alice = api_client(app)
    answer = alice.post("/v1/fine_tuning/jobs", json=_body(files["training"], {"general_data": files["general"],
                                                                                 "replay": "off"}))  # fmt: skip
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_hyperparameters", PARAM)
    assert error["message"] == (
        "method.supervised.hyperparameters.general_data is mixed in by replay: set "
        "method.supervised.hyperparameters.replay to auto or a ratio"
    )
    wrong_type = alice.post("/v1/fine_tuning/jobs", json=_body(files["training"], {"general_data": 7}))
    assert (wrong_type.json()["error"]["code"], wrong_type.json()["error"]["param"]) == ("invalid_hyperparameters",
                                                                                         PARAM)  # fmt: skip


def test_the_plan_mixes_them_in_and_names_them_as_uploaded(app, files, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the plan mixes its replay rows
    alice = api_client(app)
    answer = alice.post("/v1/fine_tuning/plan", json=_body(files["training"], {"general_data": files["general"]}))
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert plan["general_data"] == files["general"]
    assert plan["replay_added"]["source"] == "general.jsonl" and plan["replay_added"]["rows"] > 0
    text = json.dumps(plan)
    assert str(app.state.options.data_dir) not in text and "/files/" not in text
    assert not list(tmp_path.glob("finetune-replay-*"))  # the mix (the team's and the general conversations) is gone


def test_the_apis_plan_loads_no_model_and_counts_what_the_base_will_answer(app, files, tmp_path, monkeypatch):
    """Issue 49: without general conversations the base answers replay's prompts, but not in the API's request
    thread: its plan counts them (`pending`), and the worker preparing the job answers them."""
    from replay_fixtures import counting_base

    calls = counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: "A plain answer.", every_load=True)
    answer = api_client(app).post("/v1/fine_tuning/plan", json=_body(files["training"], {"replay": 0.25}))
    assert answer.status_code == 200, answer.text
    added = answer.json()["replay_added"]
    assert calls["load"] == calls["generate"] == 0 and added["source"] == "base model" and added["rows"] > 0
    assert added["pending"]["prompts"] > 0 and added["pending"]["estimated_s"] is not None


def test_the_worker_gives_the_run_the_stored_upload_and_the_job_shows_the_id(app, files, monkeypatch):
    from finetune.service.workers.preparation import JobPreparation

    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    alice, store, options = api_client(app), app.state.store, app.state.options
    created = alice.post(
        "/v1/fine_tuning/jobs", json=_body(files["training"], ONE_STEP | {"general_data": files["general"]})
    )
    job_id = created.json()["id"]
    preparation = JobPreparation(store, options, "w", None, lambda *a, **k: True, lambda *a, **k: None)
    config = preparation._config(store.get_job("alice", job_id))
    assert config.general_data == str(options.files_dir / files["general"])

    assert Worker(options, store, launcher=fake_launcher()).run_once()
    job = alice.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    assert job["hyperparameters"]["general_data"] == files["general"]  # the plan's resolved values: still the id
    plan = json.loads((options.runs_dir / f"{job_id}.plan.json").read_text())
    assert plan["settings"]["general_data"] == str(options.files_dir / files["general"])
    assert plan["replay_added"]["rows"] > 0
    assert MARKER in (options.runs_dir / job_id / "replay" / "train.jsonl").read_text()
    events = json.dumps(alice.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 100}).json())
    assert str(options.data_dir) not in events

    answer = alice.delete(f"/v1/files/{files['general']}")  # the job has ended: its replay mix goes with the file
    assert answer.status_code == 200, answer.text
    assert "replay mix" in {item["what"] for item in answer.json()["removed"]}
    assert not (options.runs_dir / job_id / "replay").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not json\n", "general.jsonl: 1 problem(s) make it unusable: line 1"),
        (b"", "general.jsonl: 1 problem(s) make it unusable: file [empty_file]"),
        (None, "general.jsonl: the file was deleted"),
    ],
)
def test_unusable_general_data_fails_the_job_naming_the_file_as_uploaded(app, files, content, message):
    alice, store, options = api_client(app), app.state.store, app.state.options
    job_id = alice.post(
        "/v1/fine_tuning/jobs", json=_body(files["training"], ONE_STEP | {"general_data": files["general"]})
    ).json()["id"]
    stored = options.files_dir / files["general"]
    if content is None:
        stored.unlink()
    else:
        stored.write_bytes(content)
    assert Worker(options, store, launcher=fake_launcher()).run_once()
    job = store.get_job("alice", job_id)
    assert job["status"] == "failed"
    assert (job["error"]["code"], job["error"]["param"]) == ("invalid_hyperparameters", PARAM)
    assert job["error"]["message"].startswith(message), job["error"]["message"]
    assert str(options.data_dir) not in job["error"]["message"]


def test_the_trainers_error_names_every_file_as_uploaded(app, files, monkeypatch):
    alice, store, options = api_client(app), app.state.store, app.state.options
    general = options.files_dir / files["general"]
    monkeypatch.setenv("FAKE_TRAINER_MODE", "fail")
    monkeypatch.setenv("FAKE_TRAINER_ERROR", f"{general}:3: no answer; {options.files_dir / files['training']}:1")
    body = _body(files["training"], ONE_STEP | {"general_data": files["general"]})
    job_id = alice.post("/v1/fine_tuning/jobs", json=body).json()["id"]
    assert Worker(options, store, launcher=fake_launcher()).run_once()
    error = store.get_job("alice", job_id)["error"]
    assert error["code"] == "training_failed" and error["message"] == "general.jsonl:3: no answer; support.jsonl:1"


def test_a_file_a_job_replays_is_in_use_until_the_job_ends(app, files):
    alice, store = api_client(app), app.state.store
    job_id = alice.post(
        "/v1/fine_tuning/jobs", json=_body(files["training"], ONE_STEP | {"general_data": files["general"]})
    ).json()["id"]
    refused = alice.delete(f"/v1/files/{files['general']}")
    assert refused.status_code == 400, refused.text
    assert (
        refused.json()["error"]["code"] == "file_in_use" and f"{job_id} (queued)" in refused.json()["error"]["message"]
    )
    later = int(time.time()) + 3600
    assert files["general"] not in {f["id"] for f in tombstones.expired_files(store.engine, later, "fine-tune-results")}

    assert alice.post(f"/v1/fine_tuning/jobs/{job_id}/cancel").status_code == 200
    assert files["general"] in {f["id"] for f in tombstones.expired_files(store.engine, later, "fine-tune-results")}
    assert alice.delete(f"/v1/files/{files['general']}").json()["deleted"] is True


def test_every_file_setting_has_its_jobs_column_and_a_file_field(app):
    assert [spec.name for spec in core.file_settings()] == ["general_data"]
    for spec in core.file_settings():
        assert core.file_column(spec.name) in jobs.c and core.file_column(spec.name) in JOB_FILE_COLUMNS
    schema = api_client(app).get("/v1/fine_tuning/hyperparameters/schema").json()["schema"]["properties"]
    general = schema["general_data"]
    assert general["title"] == "General conversations" and general["x-finetune"]["file"] is True
    assert not any(prop["x-finetune"]["file"] for key, prop in schema.items() if key != "general_data")


def test_a_version_9_database_gains_the_general_data_column(store):
    from sqlalchemy import text

    job = store.create_job("a", dict(model="toy", model_location="/m", training_file="file-x", seed=1,
                                     method={"type": "supervised"}, run_settings={}))  # fmt: skip
    with store.engine.begin() as conn:  # as a database made before version 10 looks
        conn.execute(text("ALTER TABLE jobs DROP COLUMN general_data_file"))
        conn.execute(text("UPDATE schema_version SET version = 9"))
    store.engine.dispose()
    assert store.migrate() == 9
    assert store.get_job("a", job["id"])["general_data_file"] is None
    assert store.migrate() == 10  # applied once


def test_deleting_a_jobs_general_conversations_keeps_its_training_copy_and_test_split(app, files, monkeypatch):
    """Issue 42: deleting the job's general_data file removed the run's training copy and test split too, which hold
    only the training file's conversations. It removes what was built from it: the replay mix and its tokens."""
    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    alice, options = api_client(app), app.state.options
    hyper = ONE_STEP | {"general_data": files["general"], "test_fraction": 0.25}
    job_id = alice.post("/v1/fine_tuning/jobs", json=_body(files["training"], hyper)).json()["id"]
    assert Worker(options, app.state.store, launcher=fake_launcher()).run_once()
    assert alice.get(f"/v1/fine_tuning/jobs/{job_id}").json()["status"] == "succeeded"
    run = options.runs_dir / job_id
    assert {"test.jsonl", "train.jsonl", "test_split.json", "replay"} <= {p.name for p in run.iterdir()}
    kept = {name: (run / name).read_bytes() for name in ("test.jsonl", "train.jsonl", "test_split.json")}

    answer = alice.delete(f"/v1/files/{files['general']}")
    assert answer.status_code == 200, answer.text
    removed = {item["what"] for item in answer.json()["removed"]}
    assert removed == {"upload", "replay mix", "token cache"}, removed
    assert not (run / "replay").exists()
    assert {name: (run / name).read_bytes() for name in kept} == kept
    holding = [p for p in options.data_dir.rglob("*") if p.is_file() and MARKER.encode() in p.read_bytes()]
    assert holding == [options.files_dir / files["bobs"]]  # bob's own upload of the same conversations, only

    gone = {item["what"] for item in alice.delete(f"/v1/files/{files['training']}").json()["removed"]}
    assert {"upload", "test split", "training copy", "test split record"} <= gone  # its own copies go with it


def test_a_tenant_whose_general_conversations_would_pass_its_monthly_quota_is_refused(app, files, monkeypatch):
    """Issue 47: general_data is the tenant's own data, billed like its training file: a tiny training file beside a
    large general file at replay 10 was estimated from the training file alone and trained past the quota, unbilled.
    The create's estimate now counts the general rows replay mixes in; once planned, the job's estimate bills them."""
    from finetune.service.storage import quotas

    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    alice, options, store = api_client(app), app.state.options, app.state.store
    big = _upload(alice, _general(n=200, marker="A longer general conversation, " * 8), "big-general.jsonl")
    alone = quotas.file_token_estimate(options.files_dir / files["training"], ONE_STEP)
    quotas.set_quotas(store.engine, "alice", {"max_monthly_tokens": 3 * alone})
    refused = alice.post("/v1/fine_tuning/jobs", json=_body(files["training"], ONE_STEP | {"general_data": big,
                                                                                             "replay": 10}))  # fmt: skip
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "monthly_tokens_quota_exceeded"
    assert "(estimated from support.jsonl and big-general.jsonl)" in error["message"]
    with_general = quotas.file_token_estimate(
        options.files_dir / files["training"], {"replay": 10}, options.files_dir / big
    )
    assert with_general > 3 * alone  # ten general rows per training row: past the quota the training file fits in

    quotas.set_quotas(store.engine, "alice", {"max_monthly_tokens": None})
    created = alice.post("/v1/fine_tuning/jobs", json=_body(files["training"], ONE_STEP | {"general_data": big,
                                                                                             "replay": 10}))  # fmt: skip
    job_id = created.json()["id"]
    assert Worker(options, store, launcher=fake_launcher()).run_once()
    plan = json.loads((options.runs_dir / f"{job_id}.plan.json").read_text())
    assert plan["replay_added"]["billed"] is True and plan["billing"]["general_data_tokens"] > 0
    job = alice.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["usage"]["estimate"]["billed_tokens"] == plan["tokens_billed"] == plan["tokens_processed"]
