"""Usage per job and per tenant: a worker records the estimate when it plans and the actual when the job ends, at
the prices it planned at; the sums (SQL, per job, model or day, and in total) equal the sum over the jobs' own
usage, on SQLite and PostgreSQL. Jobs run through the real validation and plan, with the stand-in trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from fake_service import fake_launcher
from fastapi.testclient import TestClient
from service_helpers import fresh_postgres_database, settings_for
from sqlalchemy import update

from finetune.service.api.objects import job_object
from finetune.service.dashboard.app import create_app
from finetune.service.storage.db import jobs
from finetune.service.storage.store import Store, new_id
from finetune.service.storage.usage import DAY, job_usage, parse_time, tenant_usage
from finetune.service.workers.worker import Worker

NUMBERS = ("billed_tokens", "device_seconds", "token_cost", "time_cost", "cost")


def _add_job(store: Store, settings, data, tenant: str, model: str = "toy") -> str:
    file_id = new_id("file")
    (settings.files_dir / file_id).write_bytes(data.read_bytes())
    store.add_file(tenant, file_id, data.name, "fine-tune", data.stat().st_size)
    values = dict(model=model, model_location=settings.models["toy"], training_file=file_id, seed=1,
                  method={"type": "supervised"}, run_settings={"max_steps": 1, "val_fraction": 0})  # fmt: skip
    return store.create_job(tenant, values)["id"]


def _run(settings, store) -> None:
    assert Worker(settings, store, launcher=fake_launcher()).run_once()


def _cancel_while_running(settings, store, job_id: str, tenant: str) -> None:
    worker = threading.Thread(target=_run, args=(settings, store))
    worker.start()
    deadline = time.monotonic() + 60
    while store.get_job(tenant, job_id)["status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the trainer runs a while
    store.transition(tenant, job_id, "cancel")
    worker.join(timeout=60)
    assert not worker.is_alive()


def _summed(usages: list[dict | None]) -> dict:
    """The sum over jobs of their usage parts (None: no estimate, or not ended), as the API sums them."""
    out = {}
    for key in NUMBERS:
        found = [u[key] for u in usages if u is not None and u[key] is not None]
        out[key] = sum(found) if found else (None if key.endswith("cost") else 0)
    return out


def _assert_same(answer: dict, expected: dict) -> None:
    for key in NUMBERS:
        if expected[key] is None:
            assert answer[key] is None, key
        else:
            assert answer[key] == pytest.approx(expected[key], rel=1e-9, abs=1e-12), key


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def used(request, tmp_path_factory, toy_model, tiny_data):
    """Tenant a: two jobs that succeeded on two models (the second planned at other prices and moved a day back),
    one cancelled while queued, one cancelled while its trainer ran, one that failed validation; tenant b: one.
    Made once per database for the module's tests, which only read."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    database_url = f"sqlite:///{tmp_path / 'test.db'}" if request.param == "sqlite" else fresh_postgres_database()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
        settings = settings_for(tmp_path / "d", toy_model, database=database_url, heartbeat_seconds=0.1,
                                price_per_million_tokens=2.5, gpu_hour_price=3.0)  # fmt: skip
        settings.make_dirs()
        store = Store(settings.database_url)
        store.migrate()
        ids = {"first": _add_job(store, settings, tiny_data, "a")}
        _run(settings, store)
        ids["other_prices"] = _add_job(store, settings, tiny_data, "a", model="toy-b")
        _run(settings_for(tmp_path / "d", toy_model, database=database_url, heartbeat_seconds=0.1,
                          price_per_million_tokens=10.0, gpu_hour_price=1.0), store)  # fmt: skip
        with store.engine.begin() as conn:
            earlier = jobs.c.created_at - DAY
            conn.execute(update(jobs).where(jobs.c.id == ids["other_prices"]).values(created_at=earlier))
        ids["cancelled_queued"] = _add_job(store, settings, tiny_data, "a")
        store.transition("a", ids["cancelled_queued"], "cancel")
        monkeypatch.setenv("FAKE_TRAINER_MODE", "wait")
        ids["cancelled_running"] = _add_job(store, settings, tiny_data, "a")
        _cancel_while_running(settings, store, ids["cancelled_running"], "a")
        bad = tmp_path / "bad.jsonl"
        bad.write_text("{not json\n")
        ids["failed"] = _add_job(store, settings, bad, "a")
        _run(settings, store)
        monkeypatch.setenv("FAKE_TRAINER_MODE", "ok")
        ids["b"] = _add_job(store, settings, tiny_data, "b")
        _run(settings, store)
    yield settings, store, ids
    store.close()


def test_a_job_records_its_estimate_and_actual_at_the_prices_it_was_planned_at(used):
    settings, store, ids = used
    job = job_object(store.get_job("a", ids["first"]))
    plan = json.loads((settings.runs_dir / f"{ids['first']}.plan.json").read_text())
    estimate, actual = job["usage"]["estimate"], job["usage"]["actual"]
    assert estimate["billed_tokens"] == plan["tokens_processed"] > 0
    assert estimate["device_seconds"] == pytest.approx(plan["cost"]["seconds"] * plan["cost"]["devices"])
    assert estimate["token_cost"] == pytest.approx(plan["cost"]["token_cost"])  # the plan's own arithmetic
    assert estimate["time_cost"] == pytest.approx(plan["cost"]["time_cost"])
    assert actual["billed_tokens"] == job["trained_tokens"] == 42  # the stand-in trainer's report
    assert actual["device_seconds"] > 0 and actual["currency"] == "USD"
    assert actual["token_cost"] == pytest.approx(42 / 1e6 * 2.5)
    assert actual["time_cost"] == pytest.approx(actual["device_seconds"] / 3600 * 3.0)
    assert actual["cost"] == pytest.approx(actual["token_cost"] + actual["time_cost"])

    events = store.list_events("a", ids["first"], None, 100).rows
    planned = next(e for e in events if e["message"].startswith("Planned"))
    done = next(e for e in events if e["message"] == "The job has successfully completed")
    assert planned["data"]["usage"] == {"estimate": estimate, "actual": None}
    assert done["data"]["usage"] == job["usage"]

    later = job_object(store.get_job("a", ids["other_prices"]))["usage"]  # planned by a worker at 10 and 1
    assert later["actual"]["token_cost"] == pytest.approx(42 / 1e6 * 10.0)
    assert later["estimate"]["time_cost"] == pytest.approx(later["estimate"]["device_seconds"] / 3600 * 1.0)


def test_a_job_that_did_not_succeed_is_billed_its_device_time_only(used):
    _, store, ids = used
    queued = job_usage(store.get_job("a", ids["cancelled_queued"]))
    assert queued["estimate"] is None  # never planned: no estimate, and no prices to cost anything at
    assert queued["actual"] == {"billed_tokens": 0, "device_seconds": 0.0, "token_cost": None, "time_cost": None,
                                "cost": None, "currency": None}  # fmt: skip
    running = job_usage(store.get_job("a", ids["cancelled_running"]))
    assert running["estimate"]["billed_tokens"] > 0
    assert running["actual"]["billed_tokens"] == 0 and running["actual"]["device_seconds"] >= 0.5
    assert running["actual"]["cost"] == pytest.approx(running["actual"]["device_seconds"] / 3600 * 3.0)
    failed = store.get_job("a", ids["failed"])
    assert failed["status"] == "failed" and job_usage(failed)["actual"]["device_seconds"] == 0.0


@pytest.mark.parametrize("group_by", ["job", "model", "day"])
def test_the_sums_equal_the_sum_over_the_jobs(used, group_by):
    _, store, ids = used
    rows = store.all_jobs("a")
    answer = tenant_usage(store, "a", group_by=group_by)
    assert answer["tenant"] == "a" and answer["group_by"] == group_by
    per_job = [job_usage(r) for r in rows]
    for part in ("actual", "estimate"):
        total = answer["total"] if part == "actual" else answer["total"]["estimate"]
        _assert_same(total, _summed([u[part] for u in per_job]))
        for group in answer["data"]:  # each group: the sum over its own jobs
            mine = [job_usage(r)[part] for r in rows if _key(r, group_by) == group["key"]]
            assert group["jobs"] == len(mine)
            _assert_same(group if part == "actual" else group["estimate"], _summed(mine))
        groups = [g if part == "actual" else g["estimate"] for g in answer["data"]]
        _assert_same(total, _summed(groups))  # and the groups add up to the total
    assert answer["total"]["jobs"] == len(rows) == 5
    assert answer["total_trained_tokens"] == answer["total"]["billed_tokens"] == 84  # two jobs succeeded, 42 each
    assert answer["total_cost"] == answer["total"]["cost"]
    if group_by == "model":
        assert [g["key"] for g in answer["data"]] == ["toy", "toy-b"]
    if group_by == "day":
        assert len(answer["data"]) == 2 and answer["data"][0]["key"] < answer["data"][1]["key"]
    if group_by == "job":  # the keys each row had before groups
        first = next(g for g in answer["data"] if g["key"] == ids["first"])
        assert first["job_id"] == ids["first"] and first["trained_tokens"] == 42 and first["status"] == "succeeded"


def _key(row: dict, group_by: str) -> str:
    if group_by == "model":
        return row["model"]
    if group_by == "day":
        return time.strftime("%Y-%m-%d", time.gmtime(row["created_at"]))
    return row["id"]


def test_a_period_counts_the_jobs_created_in_it_and_tenants_see_only_their_own(used):
    _, store, ids = used
    moved = store.get_job("a", ids["other_prices"])["created_at"]
    recent = tenant_usage(store, "a", start=moved + 1)
    assert recent["total"]["jobs"] == 4 and ids["other_prices"] not in {g["key"] for g in recent["data"]}
    only = tenant_usage(store, "a", start=moved, end=moved + 1)
    assert [g["key"] for g in only["data"]] == [ids["other_prices"]]
    other = tenant_usage(store, "b")
    assert [g["key"] for g in other["data"]] == [ids["b"]] and other["total"]["billed_tokens"] == 42
    assert tenant_usage(store, "nobody")["total"] == tenant_usage(store, "nobody", group_by="model")["total"]
    assert tenant_usage(store, "nobody")["total"]["jobs"] == 0


def test_times_are_unix_seconds_or_iso_dates():
    assert parse_time("1735689600", "start") == 1735689600
    assert parse_time("2025-01-01", "start") == 1735689600  # a date is UTC midnight
    assert parse_time("2025-01-01T01:00:00+01:00", "end") == 1735689600
    assert parse_time(None, "start") is None
    with pytest.raises(ValueError, match="start must be unix seconds or an ISO 8601 date"):
        parse_time("yesterday", "start")


# ---------------------------------------------------------------------------------------------- the route, the CLI


def test_get_v1_usage_adds_up_over_the_job_objects(used):
    settings, store, ids = used
    _, key = store.create_key("a")
    headers = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(settings, store)) as client:
        listed = client.get("/v1/fine_tuning/jobs?limit=100", headers=headers).json()["data"]
        for group_by in ("job", "model", "day"):
            answer = client.get(f"/v1/usage?group_by={group_by}", headers=headers).json()
            _assert_same(answer["total"], _summed([j["usage"]["actual"] for j in listed]))
            _assert_same(answer["total"]["estimate"], _summed([j["usage"]["estimate"] for j in listed]))
        assert client.get("/v1/usage", headers=headers).json()["group_by"] == "job"  # per job rows, as before
        moved = store.get_job("a", ids["other_prices"])["created_at"]
        day = time.strftime("%Y-%m-%d", time.gmtime(moved))
        one_day = client.get(f"/v1/usage?start={day}&end={moved - moved % DAY + DAY}", headers=headers).json()
        assert [g["key"] for g in one_day["data"]] == [ids["other_prices"]]
        assert one_day["start"] == moved - moved % DAY  # an ISO date is UTC midnight
        bad = client.get("/v1/usage?group_by=tenant", headers=headers)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "group_by"
        bad = client.get("/v1/usage?end=tomorrow", headers=headers)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "end"
        assert client.get("/v1/usage").status_code == 401


def _usage_cli(settings, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "finetune", "usage", "--data-dir", str(settings.data_dir), *args]
    env = dict(os.environ, FINETUNE_DATABASE_URL=settings.database_url)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def test_finetune_usage_shows_every_tenant_with_the_apis_numbers(used):
    settings, store, _ = used
    done = _usage_cli(settings, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert [t["tenant"] for t in answer["tenants"]] == ["a", "b"]
    assert answer["tenants"][0] == tenant_usage(store, "a", group_by="model")
    expected = _summed([tenant_usage(store, t)["total"] for t in ("a", "b")])
    _assert_same(answer["total"], expected)
    assert answer["total"]["jobs"] == 6 and answer["total"]["billed_tokens"] == 126

    text = _usage_cli(settings, "--tenant", "b")
    assert text.returncode == 0, text.stderr
    rows = [line.split() for line in text.stdout.splitlines()]
    assert [r[0] for r in rows[1:-1]] == ["b", "all"] and rows[1][1] == "toy" and rows[1][3] == "42"

    recent = json.loads(_usage_cli(settings, "--since", time.strftime("%Y-%m-%d", time.gmtime()), "--json").stdout)
    assert recent["total"]["jobs"] == 5  # the job moved a day back is left out

    wrong = _usage_cli(settings, "--since", "last week")
    assert wrong.returncode == 1 and wrong.stderr.startswith("error: --since must be unix seconds")
    assert "Traceback" not in wrong.stderr


def test_a_version_3_database_gains_the_usage_columns(store):
    from sqlalchemy import text

    from finetune.service.storage.db import USAGE_COLUMNS

    job = store.create_job("a", dict(model="toy", model_location="/m", training_file="file-x", seed=1,
                                     method={"type": "supervised"}, run_settings={}))  # fmt: skip
    with store.engine.begin() as conn:  # as a database made before version 4 looks
        for name in USAGE_COLUMNS:
            conn.execute(text(f"ALTER TABLE jobs DROP COLUMN {name}"))
        conn.execute(text("UPDATE schema_version SET version = 3"))
    store.engine.dispose()
    assert store.migrate() == 3
    row = store.get_job("a", job["id"])
    assert row["started_at"] is None and row["device_seconds"] is None
    assert job_usage(row) == {"estimate": None, "actual": None}  # queued, never planned
    assert tenant_usage(store, "a")["total"]["jobs"] == 1
