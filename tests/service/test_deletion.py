"""Delete means delete (issue 33): a file's every copy, a job's data and artifacts (a tombstone stays), a model's
checkpoints, and an operator's purge of a tenant. The first test runs a real job (the toy model, `finetune train`
as the worker starts it) with a held-out test split; the others use the stand-in trainer (fake_trainer.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_service import fake_launcher
from service_helpers import EXAMPLES, api_client, settings_for

from finetune.commands.cli import main
from finetune.service.options import ServiceOptions
from finetune.service.storage.audit_trail import AuditLog
from finetune.service.workers.worker import Worker
from finetune.settings import caches
from finetune.settings.errors import UserError

HELD_OUT = {"n_epochs": 1, "batch_size": 4, "max_seq_len": 256, "val_fraction": 0.2, "test_fraction": 0.25,
            "save_every": 1}  # fmt: skip
ONE_STEP = {"max_steps": 1, "val_fraction": 0}


def _service(tmp_path: Path, toy_model: Path, tenants=("alice", "bob")):
    """The job API in this process, fast heartbeats, a key per tenant; (app, settings)."""
    from finetune.service.dashboard.app import create_app

    settings = settings_for(tmp_path / "data", toy_model, heartbeat_seconds=0.2)
    app = create_app(settings)
    app.state.test_keys = {tenant: app.state.store.create_key(tenant)[1] for tenant in tenants}
    return app, settings


def _marked(marker: str, n: int = 16) -> bytes:
    """n support conversations, each carrying `marker` in the customer's message and in the reply."""
    lines = []
    for i, line in enumerate((EXAMPLES / "train.jsonl").read_text().splitlines()[:n]):
        record = json.loads(line)
        for message in record["messages"]:
            message["content"] += f" {marker}-{i}"
        lines.append(json.dumps(record))
    return ("\n".join(lines) + "\n").encode()


def _upload(client, content: bytes, name: str = "support.jsonl") -> str:
    answer = client.post("/v1/files", files={"file": (name, content)}, data={"purpose": "fine-tune"})
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def _create_job(client, file_id: str, hyper: dict) -> str:
    body = {"model": "toy", "training_file": file_id, "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}}}  # fmt: skip
    answer = client.post("/v1/fine_tuning/jobs", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def _holding(root: Path, needle: str) -> list[Path]:
    """Every file under `root` whose bytes contain `needle`."""
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cache_entries(root: Path, digests: set[str]) -> list[Path]:
    """Token cache entries keyed by (tokenized from) bytes of these digests."""
    found = []
    for meta in root.glob("*/meta.json"):
        key = json.loads(meta.read_text())["key"]
        if {key.get("data_sha256"), key.get("val_file_sha256")} & digests:
            found.append(meta.parent)
    return found


def _files_under(root: Path) -> dict[str, int]:
    """Every file under `root` (not the database) and its size."""
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file() and "finetune.db" not in p.name}


def test_deleting_the_file_then_its_job_leaves_no_copy_of_the_content(tmp_path, toy_model):
    marker = "ZQX-DELETE-ME-7731"
    app, settings = _service(tmp_path, toy_model)
    client = api_client(app)
    file_id = _upload(client, _marked(marker, 24))
    job_id = _create_job(client, file_id, HELD_OUT)
    assert Worker(settings, app.state.store).run_once()  # the real trainer: plan, train, weights
    job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]

    run = settings.runs_dir / job_id
    assert marker in (run / "test.jsonl").read_text()  # the held-out test split: a copy of conversations
    digests = {_sha256(settings.files_dir / file_id), _sha256(run / "train.jsonl")}
    assert _cache_entries(settings.token_cache_dir, digests)  # the job's token cache is in the data folder
    user_cache = caches.tokens()  # tests/conftest.py: this session's default token cache
    assert not _cache_entries(user_cache, digests)

    # what `finetune eval RUN` and --skip-invalid leave in a run folder: they quote the conversations
    for name in ("eval.json", "eval.html", "skipped.jsonl"):
        (run / name).write_text(json.dumps({"prompt": (run / "test.jsonl").read_text()}))
    answer = client.delete(f"/v1/files/{file_id}")
    assert answer.status_code == 200, answer.text
    assert answer.json() | {"removed": None} == {"id": file_id, "object": "file", "deleted": True, "removed": None}
    removed = {item["what"] for item in answer.json()["removed"]}
    assert {"upload", "test split", "training copy", "token cache", "evaluation answers", "skipped lines"} <= removed
    assert _holding(settings.data_dir, marker) == [] and _holding(user_cache, marker) == []
    assert _cache_entries(settings.token_cache_dir, digests) == []
    assert client.get(f"/v1/files/{file_id}").status_code == 404
    assert (run / "adapter").is_dir()  # the weights trained on it stay until the job (or model) is deleted

    answer = client.delete(f"/v1/fine_tuning/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    assert {k: answer.json()[k] for k in ("id", "object", "deleted")} == {
        "id": job_id, "object": "fine_tuning.job", "deleted": True
    }  # fmt: skip
    assert not run.exists() and not (settings.runs_dir / f"{job_id}.plan.json").exists()
    assert list(settings.logs_dir.glob(f"{job_id}*")) == []
    tombstone = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert tombstone["status"] == "succeeded" and tombstone["deleted"] is True and tombstone["deleted_at"]
    whats = {item["what"] for item in tombstone["removed"]}
    assert {"checkpoints", "weights", "run folder", "events", "fine-tuned model", "results file"} <= whats
    assert client.get(f"/v1/fine_tuning/jobs/{job_id}/events").json()["data"] == []
    assert client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"] == []
    assert job["fine_tuned_model"] not in [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert client.get(f"/v1/files/{job['result_files'][0]}").status_code == 404
    assert _holding(settings.data_dir, marker) == [] and _holding(user_cache, marker) == []
    assert client.delete(f"/v1/fine_tuning/jobs/{job_id}").json()["deleted"] is True  # again: the same answer

    # the audit trail of the whole sequence reads back in order, and a record edited by hand is caught
    trail = client.get("/v1/audit", params={"order": "asc", "limit": 100}).json()["data"]
    seen = [(r["action"], r["object_id"], r["outcome"]) for r in trail if r["tenant"] == "alice"]
    assert seen == [
        ("file.upload", file_id, "ok"),
        ("job.create", job_id, "ok"),
        ("file.delete", file_id, "ok"),
        ("job.delete", job_id, "ok"),
        ("job.delete", job_id, "ok"),
    ]
    assert not any(marker in json.dumps(r) for r in trail)  # the trail names objects, never their content
    log = AuditLog(app.state.store.engine)
    assert log.verify().ok
    with app.state.store.engine.begin() as conn:  # what a person with the database file could do
        for statement in (
            "DROP TRIGGER audit_records_no_update",
            "UPDATE audit_records SET action = 'file.list' WHERE seq = 3",
        ):
            conn.exec_driver_sql(statement)
    verdict = log.verify()
    assert not verdict.ok and verdict.bad_seq == 3
    app.state.store.close()


def test_a_file_a_job_still_needs_is_kept_and_the_refusal_names_the_job(tmp_path, toy_model, tiny_data):
    app, settings = _service(tmp_path, toy_model)
    client = api_client(app)
    file_id = _upload(client, tiny_data.read_bytes())
    job_id = _create_job(client, file_id, ONE_STEP)  # queued: no worker runs here

    refused = client.delete(f"/v1/files/{file_id}")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "file_in_use" and f"{job_id} (queued)" in error["message"]
    assert client.get(f"/v1/files/{file_id}").status_code == 200 and (settings.files_dir / file_id).is_file()

    refused = client.delete(f"/v1/fine_tuning/jobs/{job_id}")  # a job that has not ended: cancel it first
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "job_not_ended"
    assert "cancel it first" in refused.json()["error"]["message"]
    assert api_client(app, "bob").delete(f"/v1/fine_tuning/jobs/{job_id}").status_code == 404  # not bob's
    assert api_client(app, "bob").delete(f"/v1/files/{file_id}").status_code == 404

    assert client.post(f"/v1/fine_tuning/jobs/{job_id}/cancel").status_code == 200
    assert client.delete(f"/v1/fine_tuning/jobs/{job_id}").json()["deleted"] is True
    assert client.get(f"/v1/fine_tuning/jobs/{job_id}").json()["status"] == "cancelled"
    assert client.delete(f"/v1/files/{file_id}").json()["deleted"] is True  # no job needs it any more
    assert not (settings.files_dir / file_id).exists()
    app.state.store.close()


def test_deleting_a_fine_tuned_model_removes_its_checkpoints(tmp_path, toy_model, tiny_data, monkeypatch):
    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    app, settings = _service(tmp_path, toy_model)
    client = api_client(app)
    job_id = _create_job(client, _upload(client, tiny_data.read_bytes()), ONE_STEP)
    assert Worker(settings, app.state.store, launcher=fake_launcher()).run_once()
    job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    run = settings.runs_dir / job_id
    assert job["status"] == "succeeded" and (run / "checkpoints").is_dir()
    assert client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"]

    assert client.delete(f"/v1/models/{job['fine_tuned_model']}").json()["deleted"] is True
    assert not (run / "adapter").exists() and not (run / "checkpoints").exists()
    assert client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"] == []
    app.state.store.close()


def test_deleting_a_model_removes_its_gguf_files_final_and_per_checkpoint(tmp_path, toy_model, tiny_data):
    """Issue 42: GGUF files downloaded from the dashboard (the final weights and a checkpoint's, converted once and
    kept in RUN/gguf/) stayed after DELETE /v1/models/{id} until the job itself was deleted."""
    app, settings = _service(tmp_path, toy_model)
    client = api_client(app)
    hyper = {"max_steps": 2, "save_every": 1, "val_fraction": 0, "batch_size": 4, "max_seq_len": 256}
    job_id = _create_job(client, _upload(client, tiny_data.read_bytes()), hyper)
    assert Worker(settings, app.state.store).run_once()  # the real trainer: weights a GGUF can be made of
    job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    checkpoint = client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"][0]["id"]
    for params in ({"format": "gguf"}, {"format": "gguf", "checkpoint": checkpoint}):
        download = client.get(f"/v1/dashboard/jobs/{job_id}/download", params=params)
        assert download.status_code == 200 and download.content[:4] == b"GGUF", download.text
    run = settings.runs_dir / job_id
    assert len(list((run / "gguf").glob("*.gguf"))) == 2

    assert client.delete(f"/v1/models/{job['fine_tuned_model']}").json()["deleted"] is True
    assert not (run / "gguf").exists() and not (run / "checkpoints").exists() and not (run / "adapter").exists()
    assert (run / "plan.json").is_file()  # the job stays
    app.state.store.close()


def test_purge_dry_run_removes_nothing_and_purge_removes_one_tenant_only(tmp_path, toy_model, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    app, settings = _service(tmp_path, toy_model)
    alice, bob = api_client(app, "alice"), api_client(app, "bob")
    alice_file = _upload(alice, _marked("ALICE-ONLY-4410"))
    bob_file = _upload(bob, _marked("BOB-ONLY-5520"))
    alice_done = _create_job(alice, alice_file, ONE_STEP)
    bob_done = _create_job(bob, bob_file, ONE_STEP)
    worker = Worker(settings, app.state.store, launcher=fake_launcher())
    assert worker.run_once() and worker.run_once()  # both jobs: planned here (token cache), trained by the stand-in
    alice_queued = _create_job(alice, alice_file, ONE_STEP)  # never claimed: the purge cancels it
    digest = {t: {_sha256(settings.files_dir / f)} for t, f in (("alice", alice_file), ("bob", bob_file))}
    assert _cache_entries(settings.token_cache_dir, digest["alice"]) and _cache_entries(
        settings.token_cache_dir, digest["bob"]
    )
    before = _files_under(settings.data_dir)
    data = ["--data-dir", str(settings.data_dir)]

    assert main(["serve", "purge", "--tenant", "alice", "--dry-run", *data]) == 0
    listed = capsys.readouterr().out
    assert str(settings.files_dir / alice_file) in listed and str(settings.runs_dir / alice_done) in listed
    assert f"cancel job {alice_queued}" in listed and "nothing was changed" in listed
    assert str(settings.files_dir / bob_file) not in listed and bob_done not in listed
    assert _files_under(settings.data_dir) == before
    assert alice.get(f"/v1/fine_tuning/jobs/{alice_queued}").json()["status"] == "queued"
    assert alice.get("/v1/files").status_code == 200  # the key still works

    assert main(["serve", "purge", "--tenant", "alice", *data]) == 0
    assert "is purged" in capsys.readouterr().out
    assert alice.get("/v1/files").status_code == 401  # its keys revoked
    store = app.state.store
    assert store.get_file("alice", alice_file) is None and store.all_jobs("alice") == []
    assert not (settings.runs_dir / alice_done).exists() and not (settings.files_dir / alice_file).exists()
    assert _cache_entries(settings.token_cache_dir, digest["alice"]) == []
    assert _holding(settings.data_dir, "ALICE-ONLY-4410") == []

    bob_results = bob.get(f"/v1/fine_tuning/jobs/{bob_done}").json()["result_files"]
    bob_ids = [
        bob_file,
        bob_done,
        *bob_results,
        *(e.name for e in _cache_entries(settings.token_cache_dir, digest["bob"])),
    ]
    bobs = {path: size for path, size in before.items() if any(i in path for i in bob_ids)}
    after = _files_under(settings.data_dir)
    assert len(bobs) > 5 and all(after.get(path) == size for path, size in bobs.items())  # every file of bob's kept
    assert {f["id"] for f in bob.get("/v1/files").json()["data"]} == {bob_file, *bob_results}
    assert bob.get(f"/v1/fine_tuning/jobs/{bob_done}").json()["status"] == "succeeded"
    assert (settings.runs_dir / bob_done / "adapter").is_dir() and _holding(settings.data_dir, "BOB-ONLY-5520")
    purges = [r for r in AuditLog(store.engine).records() if r["action"] == "tenant.purge"]
    assert [(r["tenant"], r["via"], r["outcome"]) for r in purges] == [("alice", "cli", "ok")]  # the dry run: none
    store.close()


def test_purge_of_an_unknown_tenant_says_so(tmp_path, toy_model, capsys):
    app, settings = _service(tmp_path, toy_model)
    app.state.store.close()
    assert main(["serve", "purge", "--tenant", "nobody", "--data-dir", str(settings.data_dir)]) == 1
    assert "tenant 'nobody' has no key, file or job here" in capsys.readouterr().err


def test_a_version_4_database_gains_the_tombstone_columns(store):
    from sqlalchemy import text

    job = store.create_job("a", dict(model="toy", model_location="/m", training_file="file-x", seed=1,
                                     method={"type": "supervised"}, run_settings={}))  # fmt: skip
    with store.engine.begin() as conn:  # as a database made before version 6 looks
        conn.execute(text("ALTER TABLE jobs DROP COLUMN deleted_at"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN removed"))
        conn.execute(text("UPDATE schema_version SET version = 4"))
    store.engine.dispose()
    assert store.migrate() == 4
    row = store.get_job("a", job["id"])
    assert row["deleted_at"] is None and row["removed"] is None


def test_retention_deletes_old_ended_jobs_and_unused_files_only(tmp_path, toy_model, tiny_data, monkeypatch):
    from sqlalchemy import update

    from finetune.commands.cli import build_parser
    from finetune.service.cli.from_flags import options_from
    from finetune.service.storage.db import files, jobs
    from finetune.service.workers.retention import sweep

    monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
    app, settings = _service(tmp_path, toy_model)
    client, store = api_client(app), app.state.store
    old_file = _upload(client, tiny_data.read_bytes())
    old_job = _create_job(client, old_file, ONE_STEP)
    assert Worker(settings, store, launcher=fake_launcher()).run_once()
    busy_file = _upload(client, tiny_data.read_bytes())
    queued = _create_job(client, busy_file, ONE_STEP)  # never claimed: it still needs its file
    fresh_file = _upload(client, tiny_data.read_bytes())
    month_ago = int(time.time()) - 31 * 86400
    with store.engine.begin() as conn:
        conn.execute(update(files).where(files.c.id.in_([old_file, busy_file])).values(created_at=month_ago))
        conn.execute(update(jobs).where(jobs.c.id == old_job).values(finished_at=month_ago))
    assert sweep(settings, store) == []  # no retention period: nothing goes

    settings.retain_days = 30  # the app's own settings object
    assert sweep(settings, store) == [old_job, old_file]
    assert client.get(f"/v1/fine_tuning/jobs/{old_job}").json()["deleted"] is True
    assert not (settings.runs_dir / old_job).exists() and client.get(f"/v1/files/{old_file}").status_code == 404
    assert client.get(f"/v1/files/{busy_file}").status_code == 200  # old, but a queued job needs it
    assert client.get(f"/v1/files/{fresh_file}").status_code == 200
    assert client.get(f"/v1/fine_tuning/jobs/{queued}").json()["status"] == "queued"
    assert sweep(settings, store) == []
    store.close()

    args = build_parser().parse_args(["serve", "--retain-days", "7", "--data-dir", str(settings.data_dir)])
    assert options_from(args).retain_days == 7
    assert main(["worker", "--retain-days", "0", "--data-dir", str(settings.data_dir)]) == 1


def test_a_file_deleted_while_a_job_on_it_is_created_refuses_the_job_at_once(
    tmp_path, toy_model, tiny_data, monkeypatch
):
    """Issue 42: the file goes between the create's look at it and the job's row (the worst moment of a race): the
    job is refused then (400, as a missing file), not failed later with "the file was deleted"."""
    from finetune.service.api.routes import jobs as job_routes

    app, _ = _service(tmp_path, toy_model)
    client = api_client(app)
    file_id = _upload(client, tiny_data.read_bytes())
    looked_at = job_routes._training_file

    def look_then_lose(request, tenant, wanted, param):
        row = looked_at(request, tenant, wanted, param)
        assert api_client(app).delete(f"/v1/files/{wanted}").status_code == 200  # another request, in the window
        return row

    monkeypatch.setattr(job_routes, "_training_file", look_then_lose)
    body = {"model": "toy", "training_file": file_id, "method": {"type": "supervised", "supervised": {"hyperparameters": ONE_STEP}}}  # fmt: skip
    refused = client.post("/v1/fine_tuning/jobs", json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "invalid_training_file"
    assert client.get("/v1/fine_tuning/jobs").json()["data"] == []  # no job was added
    app.state.store.close()


def test_a_job_and_the_deletion_of_its_file_at_once_never_both_succeed(tmp_path, toy_model, tiny_data, database_url):
    """Issue 42: two threads, one creating a job on a file and one deleting that file, at the same moment, many
    rounds, on SQLite and PostgreSQL: exactly one of the two succeeds each time (both did, 3 rounds in 8)."""
    from finetune.service.dashboard.app import create_app

    app = create_app(settings_for(tmp_path / "data", toy_model, database=database_url))
    app.state.test_keys = {"alice": app.state.store.create_key("alice")[1]}
    body = {"model": "toy", "method": {"type": "supervised", "supervised": {"hyperparameters": ONE_STEP}}}
    outcomes = []
    for _ in range(12):
        file_id = _upload(api_client(app), tiny_data.read_bytes())
        start, answers = threading.Barrier(2), {}

        def create(file_id=file_id, start=start, answers=answers):
            start.wait()
            answers["create"] = api_client(app).post("/v1/fine_tuning/jobs", json=body | {"training_file": file_id})

        def remove(file_id=file_id, start=start, answers=answers):
            start.wait()
            answers["delete"] = api_client(app).delete(f"/v1/files/{file_id}")

        threads = [threading.Thread(target=create), threading.Thread(target=remove)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        created, deleted = answers["create"], answers["delete"]
        assert (created.status_code == 200) != (deleted.status_code == 200), (created.text, deleted.text)
        loser = deleted if created.status_code == 200 else created
        assert loser.json()["error"]["code"] in ("file_in_use", "invalid_training_file"), loser.text
        outcomes.append("job" if created.status_code == 200 else "delete")
    app.state.store.close()


def test_a_tombstone_keeps_no_error_text_that_quotes_the_data(tmp_path, toy_model, tiny_data):
    """Issue 42: a job failed on `unknown role "<the file's text>"`; once deleted, its tombstone kept that message.
    It keeps its status, hyperparameters, usage and the error's code and param, never the message."""
    marker = "ZQX-ROLE-QUOTED-4412"
    app, settings = _service(tmp_path, toy_model)
    client = api_client(app)
    bad = json.dumps({"messages": [{"role": marker, "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})
    file_id = _upload(client, tiny_data.read_bytes() + (bad + "\n").encode())
    job_id = _create_job(client, file_id, ONE_STEP)
    assert Worker(settings, app.state.store, launcher=fake_launcher()).run_once()
    failed = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert failed["status"] == "failed" and marker in failed["error"]["message"]  # the job's own error says it

    assert client.delete(f"/v1/fine_tuning/jobs/{job_id}").json()["deleted"] is True
    tombstone = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert marker not in json.dumps(tombstone)
    assert tombstone["status"] == "failed" and tombstone["hyperparameters"] == failed["hyperparameters"]
    assert tombstone["usage"] == failed["usage"] and tombstone["deleted"] is True
    assert {k: tombstone["error"][k] for k in ("code", "param")} == {k: failed["error"][k] for k in ("code", "param")}
    row = app.state.store.get_job("alice", job_id)
    assert marker not in json.dumps(row, default=str)  # nor the row behind it (its report, its error)
    app.state.store.close()


def test_a_retention_period_no_time_can_hold_is_one_line_at_start(tmp_path):
    """Issue 42: `--retain-days inf` was taken, and the hourly sweep then failed every hour (OverflowError). Now the
    worker (and serve) stop at once with one line, exit 1; nan, 1e300 and 0 alike."""
    for days in ("1e300", "nan", "0"):
        with pytest.raises(UserError, match="--retain-days must be a number of days above 0 and at most 36500"):
            ServiceOptions(data_dir=tmp_path / "data", retain_days=float(days))
    command = [sys.executable, "-m", "finetune", "worker", "--retain-days", "inf", "--data-dir", str(tmp_path / "d")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)  # it ran on, sweeping, before
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --retain-days must be a number of days above 0 and at most 36500 (100 years; leave it out to keep "
        "everything), got inf"
    ]


def test_deleting_a_file_leaves_no_line_of_its_team_in_the_evaluations_results(tmp_path, toy_model, tiny_data):
    """Issue 47: the retention check's team_voice kept the team's recurring lines (a sign-off holds a phone number),
    lowercased, in retention.json and in the evaluation's results, which deleting the file did not reach. Now the
    results hold a count; and results written before are rewritten when the file is deleted."""
    from finetune.service.storage.evaluations import Evaluations

    sign_off = "call us on 415 555 2671 any time"
    app, settings = _service(tmp_path, toy_model)
    client = api_client(app)
    file_id = _upload(client, tiny_data.read_bytes())
    job_id = _create_job(client, file_id, ONE_STEP)
    assert Worker(settings, app.state.store, launcher=fake_launcher()).run_once()
    evaluations = Evaluations(app.state.store.engine)
    evaluations.create("alice", job_id, True, False, None)
    claim = evaluations.claim("w", 60)
    legacy = {"retention": {"team_voice": {"n": 10, "lines": [sign_off]}, "accuracy": {"n": 3},
                            "requests": [{"tuned": f"Sure. {sign_off}"}]}}  # fmt: skip
    assert evaluations.finish(claim.evaluation["id"], claim.token, "succeeded", results=legacy)
    assert client.delete(f"/v1/files/{file_id}").status_code == 200
    answer = client.get(f"/v1/fine_tuning/jobs/{job_id}/evaluations").json()["data"][0]
    assert "2671" not in json.dumps(answer) and answer["results"]["retention"]["team_voice"]["lines"] == 1
    assert answer["results"]["retention"]["accuracy"] == {"n": 3}  # the numbers stay
    app.state.store.close()
