"""The audit trail's hash chain on SQLite and PostgreSQL: the product offers no way to change a record and the
database refuses one; a record edited or deleted by hand anyway is found and named (AuditLog.verify and
`finetune serve audit --verify`); concurrent writers never fork the chain; a route added later is recorded."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from fastapi import Response
from fastapi.testclient import TestClient
from service_helpers import api_client
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from finetune.service.api.audit_http import action_for
from finetune.service.api.audit_noise import MARK, PER_SOURCE, RECORD, SKIP, NoiseLimit
from finetune.service.storage.audit_trail import AuditLog, canonical, chain_hash

UNGUARD = {  # what a person with the database's password would run first
    "sqlite": ["DROP TRIGGER audit_records_no_update", "DROP TRIGGER audit_records_no_delete"],
    "postgresql": ["DROP TRIGGER audit_records_no_change ON audit_records"],
}


def _trail(store, n: int = 5) -> AuditLog:
    log = AuditLog(store.engine)
    for i in range(n):
        log.append("file.upload", tenant="alice", key_id="abc123", object_id=f"file-{i}", source="10.0.0.1",
                   via="api", method="POST", route="/v1/files", status=200)  # fmt: skip
    return log


def _sql(store, *statements: str) -> None:
    with store.engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def _verify_cli(database_url: str, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "finetune", "serve", "audit", "--verify", "--data-dir", str(tmp_path / "d"),
               "--database", database_url, *extra]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_an_intact_chain_verifies_and_each_hash_follows_the_one_before(store):
    log = _trail(store)
    verdict = log.verify()
    assert verdict.ok and verdict.records == 5 and verdict.head_seq == 5
    records = list(log.records())
    assert records[1]["hash"] == chain_hash(records[0]["hash"], records[1])
    assert verdict.head_hash == records[-1]["hash"]


def test_the_database_refuses_to_change_a_record(store):
    _trail(store, 2)
    for statement in ("UPDATE audit_records SET tenant = 'mallory' WHERE seq = 1", "DELETE FROM audit_records"):
        with pytest.raises(DBAPIError, match="append-only"):
            _sql(store, statement)


def test_a_record_edited_by_hand_is_detected_and_named(store, database_url, tmp_path):
    log = _trail(store)
    _sql(store, *UNGUARD[store.engine.dialect.name], "UPDATE audit_records SET object_id = 'file-x' WHERE seq = 3")
    verdict = log.verify()
    assert not verdict.ok and verdict.bad_seq == 3 and verdict.records == 2
    assert "record 3 (file.upload) does not match its hash" in verdict.problem
    found = _verify_cli(database_url, tmp_path)
    assert found.returncode == 1 and "broken at record 3" in found.stderr and "Traceback" not in found.stderr


def test_a_record_deleted_from_the_middle_is_detected(store, database_url, tmp_path):
    log = _trail(store)
    _sql(store, *UNGUARD[store.engine.dialect.name], "DELETE FROM audit_records WHERE seq = 2")
    verdict = log.verify()
    assert not verdict.ok and verdict.bad_seq == 2 and "record 2 is missing" in verdict.problem
    # renumbering the rest to hide the gap breaks the next hash instead
    _sql(store, "UPDATE audit_records SET seq = seq - 1 WHERE seq > 2")
    again = log.verify()
    assert not again.ok and again.bad_seq == 2 and "does not match its hash" in again.problem
    assert _verify_cli(database_url, tmp_path).returncode == 1


def test_a_head_noted_elsewhere_catches_a_trail_cut_short(store, database_url, tmp_path):
    log = _trail(store)
    head = log.verify()
    noted = f"{head.head_seq}:{head.head_hash}"
    assert _verify_cli(database_url, tmp_path, "--noted", noted).returncode == 0
    _sql(store, *UNGUARD[store.engine.dialect.name], "DELETE FROM audit_records WHERE seq >= 4")
    assert log.verify().ok  # what is left holds together: only the noted head tells
    cut = _verify_cli(database_url, tmp_path, "--noted", noted)
    assert cut.returncode == 1 and "record 5 is gone" in cut.stderr


def test_concurrent_writers_do_not_fork_the_chain(store):
    log = AuditLog(store.engine)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(15):
                log.append("job.create", tenant=f"t{n}", object_id=f"ftjob-{n}-{i}", source="10.0.0.2", via="api")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    verdict = log.verify()
    assert verdict.ok and verdict.records == 60


def test_a_route_added_later_is_recorded_with_a_name_made_from_its_template(app):
    @app.delete("/v1/widgets/{widget_id}")
    def delete_widget(widget_id: str) -> dict:
        return {"id": widget_id, "deleted": True}

    @app.get("/v1/exports/{export_id}")
    def export(export_id: str) -> Response:  # a download: sent as an attachment
        return Response(b"a,b\n", headers={"Content-Disposition": 'attachment; filename="e.csv"'})

    @app.post("/v1/widgets")
    def create_widget() -> dict:
        raise RuntimeError("a bug")

    alice = api_client(app, "alice")
    assert alice.delete("/v1/widgets/w-1").status_code == 200
    crashing = TestClient(app, base_url=alice.base_url, headers=alice.headers, raise_server_exceptions=False)
    assert crashing.post("/v1/widgets").status_code == 500
    assert alice.get("/v1/exports/e-1").status_code == 200
    assert alice.get("/v1/files").status_code == 200  # a read: not recorded
    data = alice.get("/v1/audit", params={"order": "asc"}).json()["data"]
    assert [(r["action"], r["object_id"], r["outcome"]) for r in data] == [
        ("widget.delete", "w-1", "ok"),
        ("widget.create", None, "failed"),
        ("export.download", "e-1", "ok"),
    ]
    assert action_for("DELETE", "/v1/fine_tuning/jobs/{job_id}") == "job.delete"
    assert action_for("PUT", "/v1/tenants/{name}/quotas") == "tenant.quotas"
    assert action_for("POST", "/v1/files/{file_id}/scan") == "file.scan"
    assert action_for("PATCH", "/v1/quotas") == "quota.update"


def test_requests_without_a_key_cannot_grow_the_trail_without_bound(app):
    """Issue 42: `DELETE /v1/files/<60 KB>` with no key stored a 60 KB record that can never be removed, and
    nothing limited how many. A record keeps at most 256 characters of what a request names (and nothing of what a
    caller without a key named); past PER_SOURCE a minute from one address, one `audit.unrecorded` record says that
    recording stopped and the rest are not recorded one by one. The chain holds."""
    log = app.state.audit
    before = log.verify().records
    anonymous = TestClient(app, base_url=api_client(app).base_url)
    huge = "x" * 60_000
    for _ in range(3 * PER_SOURCE):
        assert anonymous.delete(f"/v1/files/{huge}").status_code == 401
    records = list(log.records())[before:]
    assert [r["action"] for r in records] == ["file.delete"] * PER_SOURCE + ["audit.unrecorded"]
    assert all(r["tenant"] is None and r["outcome"] == "refused" for r in records)
    assert all(r["object_id"] is None for r in records[:-1]) and "resumes in" in records[-1]["object_id"]
    assert max(len(canonical(r)) for r in records) < 1024

    alice = api_client(app, "alice")  # a tenant's own request: recorded, what it named cut to 256 characters
    assert alice.delete(f"/v1/files/{huge}").status_code == 404
    (own,) = list(log.records())[before + PER_SOURCE + 1 :]
    assert own["tenant"] == "alice" and own["object_id"] == huge[:256]
    assert log.verify().ok


def test_the_limit_on_requests_without_a_key_counts_per_address_and_in_all_and_renews_each_minute(caplog):
    now = [0.0]
    limit = NoiseLimit(per_source=2, per_process=3, clock=lambda: now[0])
    assert [limit.admit("a") for _ in range(3)] == [RECORD, RECORD, MARK]  # two from an address
    assert [limit.admit("b"), limit.admit("c"), limit.admit("c")] == [RECORD, SKIP, SKIP]  # three in all
    now[0] = 61.0
    with caplog.at_level("WARNING"):
        assert limit.admit("c") == RECORD  # a new minute
    assert "3 request(s) without a valid key were not recorded one by one" in caplog.text
