"""The data-access layer on SQLite and PostgreSQL: tenancy, paging, transitions, leases and zombie writes."""

from __future__ import annotations

import time

import pytest

from finetune.service.storage.store import IllegalTransition, LeaseLost


def _job(store, tenant="a", **extra):
    values = dict(model="toy", model_location="/m", training_file="file-x", seed=1, method={"type": "supervised"},
                  run_settings={}) | extra  # fmt: skip
    return store.create_job(tenant, values)


def test_keys_are_hashed_and_checked(store):
    key_id, key = store.create_key("acme")
    assert store.tenant_for_key(key) == "acme"
    assert store.tenant_for_key(key[:-1] + ("x" if key[-1] != "x" else "y")) is None
    assert store.tenant_for_key("ftk-nope-nope") is None and store.tenant_for_key("garbage") is None
    assert key not in repr(store.list_keys())
    assert store.revoke_key(key_id) and store.tenant_for_key(key) is None
    assert store.ensure_default_key() is None  # keys exist already: no default key


def test_tenants_see_only_their_own(store):
    job = _job(store, "a")
    store.add_file("a", "file-1", "t.jsonl", "fine-tune", 3)
    assert store.get_job("b", job["id"]) is None and store.get_file("b", "file-1") is None
    assert store.list_jobs("b", None, 10).rows == [] and store.list_files("b", None, 10).rows == []
    assert store.list_events("b", job["id"], None, 10) is None
    assert store.transition("b", job["id"], "cancel") is None
    assert store.get_job("a", job["id"])["status"] == "queued"


def test_paging_newest_first_without_gaps(store):
    made = [_job(store)["id"] for _ in range(5)]
    seen, after = [], None
    while True:
        page = store.list_jobs("a", after, 2)
        seen += [r["id"] for r in page.rows]
        if not page.rows:
            break
        after = page.rows[-1]["id"]
    assert seen == made[::-1]
    assert store.list_jobs("a", made[0], 2).rows == []  # past the end: an empty page (old SDKs stop on it)
    assert store.list_jobs("a", "ftjob-unknown", 2).rows == []


def test_transitions(store):
    job = _job(store)
    assert store.transition("a", job["id"], "pause")["status"] == "paused"
    with pytest.raises(IllegalTransition):
        store.transition("a", job["id"], "pause")
    assert store.transition("a", job["id"], "resume")["status"] == "queued"
    assert store.transition("a", job["id"], "cancel")["status"] == "cancelled"
    for action in ("cancel", "pause", "resume"):
        with pytest.raises(IllegalTransition):
            store.transition("a", job["id"], action)


def test_claim_lease_and_zombie_writes(store):
    job = _job(store)
    first = store.claim("w1", lease_seconds=0.2)
    assert first.job["id"] == job["id"] and not first.was_running
    assert store.claim("w2", lease_seconds=30) is None  # leased
    assert first.job["status"] == "validating_files"  # claimed before it was validated
    store.worker_update(job["id"], first.token, "validated")
    store.worker_update(job["id"], first.token, "start")
    time.sleep(0.3)  # w1 goes silent past its lease
    second = store.claim("w2", lease_seconds=30)
    assert second.job["id"] == job["id"] and second.was_running and second.token != first.token
    with pytest.raises(LeaseLost):
        store.heartbeat(job["id"], first.token, 30)
    with pytest.raises(LeaseLost):
        store.worker_update(job["id"], first.token, "succeed", new_events=[{"message": "zombie"}])
    assert store.get_job("a", job["id"])["status"] == "running"
    assert "zombie" not in [e["message"] for e in store.list_events("a", job["id"], None, 100).rows]
    assert store.heartbeat(job["id"], second.token, 30) == "running"


def test_a_worker_takes_only_jobs_that_fit_its_devices(store):
    big = _job(store, run_settings={"devices": 4})  # the oldest: first in line for a worker that can run it
    small = _job(store, run_settings={"lr": 1e-4})
    assert (big["devices"], small["devices"]) == (4, 1)
    assert store.claim("one-gpu", 30, max_devices=1).job["id"] == small["id"]
    assert store.claim("two-gpus", 30, max_devices=2) is None  # the 4-device job waits, it does not fail
    assert store.claim("eight-gpus", 30, max_devices=8).job["id"] == big["id"]
    third = _job(store, run_settings={"devices": 2})
    assert store.claim("cpu", 30, max_devices=None).job["id"] == third["id"]  # no limit: CPU processes


def test_a_version_1_database_gains_the_devices_column(tmp_path):
    from sqlalchemy import text

    from finetune.service.storage.store import Store

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Store(url)
    old.migrate()
    job = _job(old)
    with old.engine.begin() as conn:  # as a database made before version 2 looks
        conn.execute(text("ALTER TABLE jobs DROP COLUMN devices"))
        conn.execute(text("UPDATE schema_version SET version = 1"))
    old.close()
    store = Store(url)
    assert store.migrate() == 1
    assert store.get_job("a", job["id"])["devices"] == 1
    assert store.claim("w", 30, max_devices=1).job["id"] == job["id"]
    store.close()


def test_cancel_wins_over_a_late_completion(store):
    job = _job(store)
    claim = store.claim("w1", 30)
    store.worker_update(job["id"], claim.token, "validated")
    store.worker_update(job["id"], claim.token, "start")
    store.transition("a", job["id"], "cancel")
    assert not store.worker_update(job["id"], claim.token, "succeed")
    terminal = [e for e in store.list_events("a", job["id"], None, 100).rows if "cancelled" in e["message"]]
    assert store.get_job("a", job["id"])["status"] == "cancelled" and len(terminal) == 1
