"""Workers, with the real validation and plan but a stand-in trainer (fake_trainer.py): many jobs in seconds.

The 4-workers test runs real worker processes against PostgreSQL (FOR UPDATE SKIP LOCKED), started through the
test-only entry point fake_service.py (`finetune worker` with the stand-in trainer)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter

from fake_service import fake_launcher
from service_helpers import EXAMPLES, FAKE_SERVICE, fresh_postgres_database, settings_for

from finetune.service.storage.store import Store, new_id
from finetune.service.workers.worker import Worker


def _add_job(store: Store, settings, data, tenant="a", **extra) -> str:
    file_id = new_id("file")
    shutil.copy(data, settings.files_dir / file_id)
    store.add_file(tenant, file_id, "tiny.jsonl", "fine-tune", data.stat().st_size)
    values = dict(model="toy", model_location=settings.models["toy"], training_file=file_id, seed=1,
                  method={"type": "supervised"}, run_settings={"max_steps": 1, "val_fraction": 0}) | extra  # fmt: skip
    return store.create_job(tenant, values)["id"]


def _sqlite_service(tmp_path, toy_model):
    """Settings (fast heartbeats) and a migrated SQLite store, as `finetune serve` would make them."""
    settings = settings_for(tmp_path / "d", toy_model, heartbeat_seconds=0.1)
    settings.make_dirs()
    store = Store(settings.database_url)
    store.migrate()
    return settings, store


def _fake(monkeypatch, mode: str = "ok") -> None:
    monkeypatch.setenv("FAKE_TRAINER_MODE", mode)


def _worker(settings, store) -> Worker:
    """A worker whose trainer is the stand-in (the seam: Worker's train_command)."""
    return Worker(settings, store, launcher=fake_launcher())


def test_a_job_runs_to_succeeded(tmp_path, toy_model, tiny_data, monkeypatch):
    _fake(monkeypatch)
    settings, store = _sqlite_service(tmp_path, toy_model)
    job_id = _add_job(store, settings, tiny_data)
    assert _worker(settings, store).run_once()
    job = store.get_job("a", job_id)
    assert job["status"] == "succeeded" and job["trained_tokens"] == 42 and job["attempts"] == 1
    assert job["fine_tuned_model"] == f"ft:toy:a::{job_id}"
    results = store.get_file("a", job["result_files"][0])
    assert results["purpose"] == "fine-tune-results"
    assert (settings.files_dir / results["id"]).read_text().startswith("step,train_loss,train_accuracy,valid_loss")
    messages = [e["message"] for e in store.list_events("a", job_id, None, 100).rows]
    assert sum("successfully completed" in m for m in messages) == 1


def test_a_file_that_cannot_train_fails_as_the_files_problem_not_the_settings(
    tmp_path, toy_model, tiny_data, monkeypatch
):
    """What validation lets through but the data path refuses (here: a stand-in for a template that refuses one
    conversation) fails as invalid_training_file, named as uploaded; a setting that cannot work as
    invalid_hyperparameters."""
    from finetune.data import dispatch as prepare
    from finetune.settings.errors import UserError

    _fake(monkeypatch)
    settings, store = _sqlite_service(tmp_path, toy_model)
    refused = _add_job(store, settings, tiny_data)
    real_prepare = prepare.prepare_data

    def refusing(config, *args, **kwargs):
        if refused in config.out:
            raise UserError(f"{config.data}:3: the chat template refuses this conversation: no")
        return real_prepare(config, *args, **kwargs)

    monkeypatch.setattr(prepare, "prepare_data", refusing)
    bad_setting = _add_job(store, settings, tiny_data, run_settings={"grad_accum": 64, "last_batch": "drop"})
    worker = _worker(settings, store)
    assert worker.run_once() and worker.run_once()
    error = store.get_job("a", refused)["error"]
    assert error == {
        "code": "invalid_training_file",
        "message": "tiny.jsonl:3: the chat template refuses this conversation: no",
        "param": "training_file",
    }
    error = store.get_job("a", bad_setting)["error"]
    assert error["code"] == "invalid_hyperparameters" and "no step would be taken" in error["message"]


def test_three_deaths_at_the_same_step_fail_the_job(tmp_path, toy_model, tiny_data, monkeypatch):
    _fake(monkeypatch, "die")
    settings, store = _sqlite_service(tmp_path, toy_model)
    job_id = _add_job(store, settings, tiny_data)
    worker = _worker(settings, store)
    for _ in range(3):
        assert worker.run_once()
    job = store.get_job("a", job_id)
    assert job["status"] == "failed" and job["attempts"] == 3
    assert job["error"]["code"] == "training_died" and "3 times at step 0" in job["error"]["message"]
    assert not worker.run_once()  # nothing left to claim


def test_four_workers_forty_jobs_each_run_exactly_once(tmp_path, toy_model, tiny_data, monkeypatch):
    url = fresh_postgres_database()
    _fake(monkeypatch)
    log = tmp_path / "runs.log"
    monkeypatch.setenv("FAKE_TRAINER_LOG", str(log))
    settings = settings_for(tmp_path / "d", toy_model, database=url)
    settings.make_dirs()
    store = Store(url)
    store.migrate()
    ids = [_add_job(store, settings, tiny_data) for _ in range(40)]
    command = [sys.executable, str(FAKE_SERVICE), "worker", "--data-dir", str(settings.data_dir), "--database", url,
               "--heartbeat-seconds", "0.2"]  # fmt: skip
    workers = [subprocess.Popen(command, env=os.environ, stdout=subprocess.DEVNULL) for _ in range(4)]
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            statuses = Counter(store.get_job("a", i)["status"] for i in ids)
            if statuses["succeeded"] + statuses["failed"] == len(ids):
                break
            time.sleep(0.5)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
    jobs = [store.get_job("a", i) for i in ids]
    assert Counter(j["status"] for j in jobs) == {"succeeded": 40}
    assert Counter(log.read_text().split()) == dict.fromkeys(ids, 1)  # every job trained exactly once
    assert {j["attempts"] for j in jobs} == {1}
    assert len({j["worker"] for j in jobs}) == 1  # released: no job still names a worker


def test_a_job_paused_before_validation_is_still_validated_after_resume(tmp_path, toy_model, monkeypatch):
    _fake(monkeypatch)
    settings, store = _sqlite_service(tmp_path, toy_model)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    job_id = _add_job(store, settings, bad)
    store.transition("a", job_id, "pause")
    assert not _worker(settings, store).run_once()  # paused: nothing to claim
    store.transition("a", job_id, "resume")
    assert _worker(settings, store).run_once()
    job = store.get_job("a", job_id)
    assert job["status"] == "failed" and job["error"]["code"] == "invalid_training_file"
    assert "line 1" in job["error"]["message"]


def test_the_lease_is_kept_while_a_slow_validation_runs(tmp_path, toy_model, tiny_data, monkeypatch):
    """A regression: validation and planning ran without a heartbeat, so under load another worker took the job
    meanwhile and it was trained twice."""
    import threading

    from finetune.service.workers import library as core

    _fake(monkeypatch)
    settings = settings_for(tmp_path / "d", toy_model, lease_seconds=3, heartbeat_seconds=0.3)  # margin for a busy CI
    settings.make_dirs()
    store = Store(settings.database_url)
    store.migrate()
    job_id = _add_job(store, settings, tiny_data)
    real_validate = core.screen_training_file  # the validation every job's files get (the plan tokenizes them)
    monkeypatch.setattr(core, "screen_training_file", lambda *a: time.sleep(7) or real_validate(*a))
    worker = threading.Thread(target=_worker(settings, store).run_once)
    worker.start()
    while store.get_job("a", job_id)["worker"] is None:  # the worker's claim comes first
        time.sleep(0.01)
    stolen = []
    while worker.is_alive():
        claim = store.claim("thief", lease_seconds=30)
        if claim:
            stolen.append(claim.job["id"])
            store.release(claim.job["id"], claim.token)
        time.sleep(0.1)
    worker.join()
    job = store.get_job("a", job_id)
    assert stolen == [] and job["status"] == "succeeded" and job["attempts"] == 1


def test_the_events_name_split_and_dropped_lines_by_the_uploaded_name(tmp_path, toy_model, monkeypatch):
    """Issue 35: the worker's events said `file-<id>:N` (the stored upload's name) where every other message names
    the file as uploaded."""
    import json

    _fake(monkeypatch)
    settings, store = _sqlite_service(tmp_path, toy_model)
    rows = [{"messages": [{"role": "user", "content": f"question {n}"},
                          {"role": "assistant", "content": "ok " * (400 if n in (3, 9) else 5)}]}
            for n in range(1, 13)]  # fmt: skip
    data = tmp_path / "support.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    job_id = _add_job(store, settings, data, run_settings={"max_steps": 1, "val_fraction": 0, "max_seq_len": 128})
    assert _worker(settings, store).run_once()
    messages = [e["message"] for e in store.list_events("a", job_id, None, 100).rows]
    dropped = next(m for m in messages if m.startswith("[dropped_examples]"))
    assert dropped.endswith(": tiny.jsonl:3, tiny.jsonl:9"), dropped  # _add_job uploads it as tiny.jsonl
    assert not any("file-" in m for m in messages), messages


def test_a_usable_file_is_tokenized_once_by_the_plan(tmp_path, toy_model, tiny_data, monkeypatch):
    """Issue 32: the worker's validation tokenized the file, then its plan tokenized it again. Validation now checks
    what needs no tokenizer; the plan's preparation tokenizes once (into the token cache its trainer reads), and the
    full validation runs only to explain a file the plan refused."""
    from finetune.data.tokenize import ChatTokenizer
    from finetune.service.workers import library as core

    _fake(monkeypatch)
    settings, store = _sqlite_service(tmp_path, toy_model)
    job_id = _add_job(store, settings, tiny_data)
    made, validated = [], []
    real_init, real_validate = ChatTokenizer.__init__, core.validate_file
    monkeypatch.setattr(ChatTokenizer, "__init__", lambda self, *a, **k: made.append(1) or real_init(self, *a, **k))
    monkeypatch.setattr(core, "validate_file", lambda *a, **k: validated.append(1) or real_validate(*a, **k))
    assert _worker(settings, store).run_once()
    assert store.get_job("a", job_id)["status"] == "succeeded"
    assert validated == [] and len(made) == 1  # one tokenizer over the records in this process: the plan's


# validate and plan a job in a fresh process, the way a worker does, then say whether torch was imported
VALIDATE_AND_PLAN = """
import json, shutil, sys
from pathlib import Path
import transformers
# transformers 5's AutoTokenizer imports torch itself (configuration_utils -> modeling_rope_utils): the toy's
# tokenizer loads through the class it declares instead, so what is measured is the worker's own code
transformers.AutoTokenizer = transformers.PreTrainedTokenizerFast
from finetune.service.options import ServiceOptions
from finetune.service.storage.store import Store, new_id
from finetune.service.workers.worker import Worker
from finetune.train.launchers import LocalLauncher

data_dir, model, data = map(Path, sys.argv[1:4])
options = ServiceOptions(data_dir=data_dir, models={"toy": str(model)})
options.make_dirs()
store = Store(options.database_url)
store.migrate()
file_id = new_id("file")
shutil.copy(data, options.files_dir / file_id)
store.add_file("a", file_id, "tiny.jsonl", "fine-tune", data.stat().st_size)
store.create_job("a", dict(model="toy", model_location=str(model), training_file=file_id, seed=1,
                 method={"type": "supervised"}, run_settings={"max_steps": 1, "val_fraction": 0}))
worker = Worker(options, store, launcher=LocalLauncher())  # the real one: it counts devices
claim = store.claim(worker.name, options.lease_seconds)
plan_path = options.runs_dir / f"{claim.job['id']}.plan.json"
ready = worker.preparation.prepare(claim.job, claim.token, plan_path)
status = store.get_job("a", claim.job["id"])["status"]
print(json.dumps({"ready": ready, "status": status, "plan": plan_path.is_file(), "torch": "torch" in sys.modules}))
"""


def test_a_worker_validates_and_plans_a_job_without_torch(tmp_path, toy_model, tiny_data):
    """Issue 32: a worker never trains in its own process (its trainer does), so validating and planning a job
    must not import torch: `plan_run(config, measure=False)` and the worker's own modules are torch-free. (Loading
    a tokenizer through transformers 5's AutoTokenizer still imports torch; the script stands it aside.)"""
    import json

    done = subprocess.run(
        [sys.executable, "-c", VALIDATE_AND_PLAN, str(tmp_path / "d"), str(toy_model), str(tiny_data)],
        capture_output=True, text=True, timeout=300, env=os.environ,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer == {"ready": True, "status": "queued", "plan": True, "torch": False}


def _with_invalid_lines(path, source, n: int) -> bytes:
    lines = source.read_text().splitlines()[:n]
    lines[2] = '{"messages": "not a list"}'  # invalid: --skip-invalid leaves it out
    lines[5] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    return path.read_bytes()


def test_a_job_honours_skip_invalid_as_the_plan_does(app, tmp_path, monkeypatch):
    """Issue 42: with `skip_invalid: true` POST /v1/fine_tuning/plan accepted a file (its own 400 recommends the
    setting) that a job with the same body failed at validation. Chat data with and without a test split, and
    preference pairs: the plan and the job both take them, leaving lines 3 and 6 out; without it both refuse."""
    from service_helpers import api_client

    _fake(monkeypatch)
    client = api_client(app, "alice")
    chat = _with_invalid_lines(tmp_path / "chat.jsonl", EXAMPLES / "train.jsonl", 24)
    pairs = _with_invalid_lines(tmp_path / "pairs.jsonl", EXAMPLES / "prefs.jsonl", 24)
    cases = [(chat, "supervised", {}), (chat, "supervised", {"test_fraction": 0.2}), (pairs, "dpo", {})]
    for content, kind, extra in cases:
        file_id = client.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": ("mixed.jsonl", content)})
        hyper = {"max_steps": 1, "val_fraction": 0, **extra}
        body = {"model": "toy", "training_file": file_id.json()["id"], "method": {"type": kind, kind: {"hyperparameters": hyper}}}  # fmt: skip
        refused = client.post("/v1/fine_tuning/plan", json=body)
        assert refused.status_code == 400 and "skip_invalid" in refused.json()["error"]["message"], refused.text
        body["method"][kind]["hyperparameters"]["skip_invalid"] = True
        planned = client.post("/v1/fine_tuning/plan", json=body)
        assert planned.status_code == 200, (kind, extra, planned.text)
        job_id = client.post("/v1/fine_tuning/jobs", json=body).json()["id"]
        assert Worker(app.state.options, app.state.store, launcher=fake_launcher()).run_once()
        job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
        assert job["status"] == "succeeded", (kind, extra, job["error"])
        events = client.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 100}).json()["data"]
        assert any("[skipped_lines]" in e["message"] and "2 invalid line(s)" in e["message"] for e in events), kind


def test_a_jobs_replay_answers_are_given_in_its_preparation_with_a_line_per_batch(tmp_path, toy_model, tiny_data,
                                                                                 monkeypatch):  # fmt: skip
    """Issue 49: the API's plan counts replay rows; the worker preparing the job is where the base answers them, its
    estimate first and then a line per batch, as the job's events (each renewing the lease)."""
    from replay_fixtures import counting_base

    from finetune.data import replay_mix

    _fake(monkeypatch)
    monkeypatch.setattr(replay_mix, "training_prompts", lambda: replay_mix.replay_prompts()[:40])
    calls = counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: "A plain general answer.")
    settings, store = _sqlite_service(tmp_path, toy_model)
    run_settings = {"max_steps": 12, "val_fraction": 0, "replay": 1.0, "general_val": False}
    job_id = _add_job(store, settings, tiny_data, run_settings=run_settings)
    assert _worker(settings, store).run_once()
    assert calls["generate"] >= 1 and store.get_job("a", job_id)["status"] == "succeeded"
    events = list(reversed(store.list_events("a", job_id, None, 100).rows))  # oldest first
    said = [e["message"] for e in events]
    first = next(i for i, m in enumerate(said) if m.startswith("The base model answers up to "))
    batches = [e for e in events[first:] if e["message"].startswith("The base model answered ")]
    assert len(batches) == calls["generate"] and batches[-1]["data"]["answered"] == len(calls["asked"])
    assert first < next(i for i, m in enumerate(said) if m.startswith("Planned "))  # before the plan's summary
