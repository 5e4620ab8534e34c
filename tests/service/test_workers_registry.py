"""Issue 26: a dead embedded worker stayed dead, and a job waiting for a worker read `validating_files`.

The workers registry (register, heartbeat, live, goodbye), /healthz saying when no worker is live, a job created
without one reading `queued`, and `serve` restarting a worker killed with SIGKILL (a new job still succeeds)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

from openai import OpenAI
from service_helpers import Server, api_client

from finetune.service.storage.store import Store
from finetune.service.workers.supervise import FIRST_PAUSE_S, LONGEST_PAUSE_S, STABLE_AFTER_S, next_pause


def test_register_heartbeat_live_and_goodbye(store):
    store.workers.register("h:1", "h", 1, 4, "h100-80gb")
    store.workers.register("h:2", "h", 2, None, "cpu")
    live = store.workers.live(lease_seconds=30)
    assert [(w["name"], w["devices"], w["device_kind"], w["draining"]) for w in live] == [
        ("h:1", 4, "h100-80gb", False),
        ("h:2", None, "cpu", False),
    ]
    assert live[0]["speeds"] == {}  # measured when it plans a job (train/speed.py)
    store.workers.heartbeat("h:1", draining=True)
    assert [w["draining"] for w in store.workers.live(30)] == [True, False]
    store.workers.forget("h:2")
    assert [w["name"] for w in store.workers.live(30)] == ["h:1"]
    time.sleep(0.3)
    assert store.workers.live(lease_seconds=0.2) == []  # silent past the lease: not live
    store.workers.heartbeat("h:1")
    assert [w["name"] for w in store.workers.live(0.2)] == ["h:1"]


def test_a_version_2_database_gains_the_registry_idempotency_keys_and_model_deletion(tmp_path):
    from sqlalchemy import text

    from finetune.service.storage.db import SCHEMA_VERSION

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Store(url)
    old.migrate()
    job = old.create_job("a", dict(model="toy", model_location="/m", training_file="file-x", seed=1,
                                   method={"type": "supervised"}, run_settings={}))  # fmt: skip
    with old.engine.begin() as conn:  # as a database made before version 3 looks
        conn.execute(text("DROP TABLE workers"))
        conn.execute(text("DROP TABLE idempotency_keys"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN model_deleted_at"))
        conn.execute(text("UPDATE schema_version SET version = 2"))
    old.close()
    store = Store(url)
    assert store.migrate() == 2
    assert store.get_job("a", job["id"])["model_deleted_at"] is None
    store.workers.register("h:1", "h", 1, 1, "cpu")
    assert [w["name"] for w in store.workers.live(30)] == ["h:1"]
    assert store.idempotency.begin("a", "k", "POST /v1/files", "0" * 64) is None
    assert store.migrate() == SCHEMA_VERSION  # applied once
    store.close()


def test_healthz_counts_live_workers_and_a_job_waits_queued_without_one(app, tiny_data):
    client = api_client(app)
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["workers"] == 0 and "no live worker" in health["warnings"][0]

    upload = client.post(
        "/v1/files", data={"purpose": "fine-tune"}, files={"file": ("t.jsonl", tiny_data.read_bytes())}
    )
    job = client.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": upload.json()["id"]}).json()
    assert job["status"] == "queued"  # waiting for a worker: not validating anything

    store = app.state.store
    store.workers.register("h:1", "h", 1, 1, "cpu")
    assert client.get("/healthz").json() == {"status": "ok", "workers": 1}
    claim = store.claim("h:1", lease_seconds=30)
    assert claim.job["id"] == job["id"] and claim.job["status"] == "validating_files"
    assert client.get(f"/v1/fine_tuning/jobs/{job['id']}").json()["status"] == "validating_files"
    store.workers.heartbeat("h:1", draining=True)  # stopping: it takes no new job
    assert client.get("/healthz").json()["workers"] == 0


def test_the_pause_before_a_restart_doubles_up_to_a_minute_and_starts_again_after_a_stable_run():
    pauses, pause = [], None
    for _ in range(9):
        pause = next_pause(pause, lived_s=0.5)
        pauses.append(pause)
    assert pauses == [1, 2, 4, 8, 16, 32, 60, 60, 60] and (FIRST_PAUSE_S, LONGEST_PAUSE_S) == (1, 60)
    assert next_pause(60, lived_s=STABLE_AFTER_S) == 1


def _children_running(server: Server, text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == server.process.pid and text.encode() in cmdline:
            found.append(int(proc.name))
    return found


def _workers_live(server: Server) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as answer:
        return json.loads(answer.read())["workers"]


def test_serve_restarts_a_worker_killed_with_sigkill_and_a_new_job_succeeds(tmp_path, toy_model, tiny_data):
    server = Server(tmp_path / "data", toy_model, workers=1, fake=True,
                    extra=("--heartbeat-seconds", "0.2", "--lease-seconds", "5"))  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (_children_running(server, "worker") and _workers_live(server) == 1):
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.2)
        (first,) = _children_running(server, "worker")
        os.kill(first, signal.SIGKILL)

        client = OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
        f = client.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
        job = client.fine_tuning.jobs.create(model="toy", training_file=f.id)
        deadline = time.monotonic() + 120
        while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, (job.status, server.output())
            time.sleep(0.3)
        assert job.status == "succeeded", job.error
        log = server.output()
        assert f"worker 1 (pid {first}) died (killed by SIGKILL); restarting it in 1 s" in log, log
        assert "worker 1 restarted (pid" in log
        (second,) = _children_running(server, "worker")
        assert second != first
    finally:
        server.stop()


def _gone(pid: int) -> bool:
    """Exited (a zombie nobody reaps counts: the process runs no more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_serve_takes_its_busy_worker_and_trainer_with_it(tmp_path, toy_model, tiny_data):
    """Issue 35: SIGKILL to `serve` left its embedded worker running on, orphaned. The worker (busy with a job whose
    trainer is in a long step, deaf to SIGTERM) and its trainer now die with serve; the job keeps its lease, to be
    resumed by the next worker once it runs out."""
    env = {**os.environ, "FAKE_TRAINER_MODE": "stubborn"}
    server = Server(tmp_path / "data", toy_model, workers=1, fake=True, env=env,
                    extra=("--heartbeat-seconds", "0.2", "--lease-seconds", "30"))  # fmt: skip
    try:
        client = OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
        f = client.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
        job = client.fine_tuning.jobs.create(model="toy", training_file=f.id)
        deadline = time.monotonic() + 60
        while not (workers := _children_running(server, "worker")) or not _trainers_of(workers[0]):
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.2)
        (worker,) = workers
        (trainer,) = _trainers_of(worker)
        server.process.kill()
        server.process.wait()
        deadline = time.monotonic() + 5
        while not (_gone(worker) and _gone(trainer)):
            assert time.monotonic() < deadline, f"worker gone: {_gone(worker)}, trainer gone: {_gone(trainer)}"
            time.sleep(0.1)
        store = Store(f"sqlite:///{server.data_dir / 'finetune.db'}")
        try:
            assert store.get_job_any(job.id)["status"] == "running"  # until its lease runs out: then resumed
        finally:
            store.close()
    finally:
        server.stop()


def _trainers_of(worker: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == worker and b"fake_trainer" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return found
