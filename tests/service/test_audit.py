"""The audit trail through a real `finetune serve` (no worker: nothing here trains) and the official openai SDK: every
write and download is one record, read back in order by its tenant (GET /v1/audit, paged as the SDK pages),
exported by the operator as JSON lines (`finetune serve audit`), and no key is ever in it."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest
from openai import BaseModel, OpenAI
from openai.pagination import SyncCursorPage
from service_helpers import Server

OK = {"outcome": "ok", "status": 200}


class AuditRecord(BaseModel):
    id: str
    seq: int
    action: str
    tenant: str | None = None
    key_id: str | None = None
    object_id: str | None = None
    source: str
    via: str
    status: int | None = None
    outcome: str
    hash: str


def _finetune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "finetune", *args], capture_output=True, text=True, timeout=120)


def _new_key(data_dir, tenant: str) -> str:
    made = _finetune("keys", "create", "--tenant", tenant, "--data-dir", str(data_dir))
    assert made.returncode == 0, made.stderr
    return made.stdout.split()[-1]


@pytest.fixture(scope="module")
def service(tmp_path_factory, toy_model):
    data_dir = tmp_path_factory.mktemp("audit") / "data"
    keys = {tenant: _new_key(data_dir, tenant) for tenant in ("alice", "bob")}  # before serve: no default key
    server = Server(data_dir, toy_model, workers=0)
    server.keys = keys
    yield server
    server.stop()


def _sdk(service, tenant: str) -> OpenAI:
    return OpenAI(base_url=service.url, api_key=service.keys[tenant], max_retries=0)


def _records(client: OpenAI, **params) -> list[AuditRecord]:
    """Every record the caller may read, oldest first, through the SDK's own cursor paging."""
    page = client.get_api_list(
        "/audit", model=AuditRecord, page=SyncCursorPage[AuditRecord], options={"params": {"order": "asc"} | params}
    )
    return list(page)


def _key_id(key: str) -> str:
    return key.split("-")[1]


def test_a_sequence_reads_back_in_order_with_its_actions_objects_and_outcomes(service, tiny_data):
    alice = _sdk(service, "alice")
    before = [r.seq for r in _records(alice)]
    uploaded = alice.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    job = alice.fine_tuning.jobs.create(model="toy", training_file=uploaded.id, seed=3)
    alice.fine_tuning.jobs.cancel(job.id)
    with pytest.raises(openai.BadRequestError):  # cancelling it again is refused (400): the refusal is recorded too
        alice.fine_tuning.jobs.cancel(job.id)
    assert alice.files.content(uploaded.id).read() == tiny_data.read_bytes()
    alice.files.delete(uploaded.id)
    new_key = _new_key(service.data_dir, "alice")

    records = [r for r in _records(alice) if r.seq not in before]
    assert [(r.action, r.object_id, r.outcome, r.status) for r in records] == [
        ("file.upload", uploaded.id, "ok", 200),
        ("job.create", job.id, "ok", 200),
        ("job.cancel", job.id, "ok", 200),
        ("job.cancel", job.id, "refused", 400),
        ("file.download", uploaded.id, "ok", 200),
        ("file.delete", uploaded.id, "ok", 200),
        ("key.create", _key_id(new_key), "ok", None),
    ]
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    api, cli = records[:-1], records[-1]
    assert all(r.key_id == _key_id(service.keys["alice"]) and r.source == "127.0.0.1" and r.via == "api" for r in api)
    assert (cli.tenant, cli.key_id, cli.source, cli.via) == ("alice", _key_id(new_key), "cli", "cli")
    assert all(r.tenant == "alice" for r in records)
    # no key secret anywhere: not in the API's answer, the operator's export, nor the database file
    export = _finetune("serve", "audit", "--data-dir", str(service.data_dir))
    assert export.returncode == 0, export.stderr
    every = json.dumps([r.to_dict() for r in _records(alice)]) + export.stdout
    stored = b"".join(path.read_bytes() for path in service.data_dir.glob("finetune.db*"))  # with its WAL
    for key in (*service.keys.values(), new_key):
        secret = key.split("-", 2)[2]
        assert secret not in every and secret.encode() not in stored


def test_a_tenant_sees_only_its_own_records(service, tiny_data):
    alice, bob = _sdk(service, "alice"), _sdk(service, "bob")
    uploaded = alice.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError):  # bob asks for alice's file: refused (404), and recorded as bob's
        bob.files.content(uploaded.id)
    bob.files.create(file=("bob.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    seen_by_alice, seen_by_bob = _records(alice), _records(bob)
    assert {r.tenant for r in seen_by_alice} == {"alice"} and {r.tenant for r in seen_by_bob} == {"bob"}
    refused = [r for r in seen_by_bob if r.action == "file.download"]
    assert [(r.object_id, r.outcome, r.status) for r in refused] == [(uploaded.id, "refused", 404)]
    assert not {r.seq for r in seen_by_alice} & {r.seq for r in seen_by_bob}


def test_the_trail_pages_like_the_other_lists(service, tiny_data):
    alice = _sdk(service, "alice")
    for _ in range(3):
        alice.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    whole = _records(alice, limit=1000)
    assert len(whole) >= 5
    assert [r.seq for r in _records(alice, limit=2)] == [r.seq for r in whole]  # the SDK follows `after`
    newest = alice.get("/audit", cast_to=httpx.Response, options={"params": {"limit": 2}}).json()
    assert newest["object"] == "list" and newest["has_more"] is True
    assert [r["seq"] for r in newest["data"]] == [whole[-1].seq, whole[-2].seq]  # newest first by default
    after = alice.get("/audit", cast_to=httpx.Response, options={"params": {"limit": 2, "after": newest["last_id"]}})
    assert [r["seq"] for r in after.json()["data"]] == [whole[-3].seq, whole[-4].seq]


def test_dashboard_sign_in_sign_out_and_a_weights_download_are_recorded(service, tiny_data):
    alice = _sdk(service, "alice")
    uploaded = alice.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    job = alice.fine_tuning.jobs.create(model="toy", training_file=uploaded.id)
    weights = service.data_dir / "runs" / job.id / "adapter"  # as a finished trainer leaves them
    weights.mkdir(parents=True)
    (weights / "adapter_model.safetensors").write_bytes(b"weights")
    base = service.url.removesuffix("/v1")
    with httpx.Client(base_url=base, headers={"Origin": base}) as browser:
        assert browser.post("/v1/dashboard/session", json={"key": service.keys["alice"]}).status_code == 200
        assert browser.get(f"/v1/dashboard/jobs/{job.id}/download").status_code == 200
        assert browser.delete("/v1/dashboard/session", headers={"Content-Type": "application/json"}).status_code == 200
    assert httpx.post(f"{base}/v1/dashboard/session", json={"key": "ftk-nobody-wrong"}).status_code == 401
    assert httpx.post(f"{base}/v1/dashboard/session", data={"key": "ftk-nobody-wrong"}).status_code == 303  # a form
    tail = [(r.action, r.object_id, r.via, r.outcome) for r in _records(alice)][-3:]
    assert tail == [
        ("session.sign_in", None, "dashboard", "ok"),
        ("model.download", job.id, "dashboard", "ok"),
        ("session.sign_out", None, "dashboard", "ok"),
    ]
    exported = _finetune("serve", "audit", "--data-dir", str(service.data_dir))
    refused = [json.loads(line) for line in exported.stdout.splitlines()[-2:]]  # no tenant: the operator's only
    assert [(r["action"], r["tenant"], r["key_id"], r["outcome"], r["status"]) for r in refused] == [
        ("session.sign_in", None, None, "refused", 401),
        ("session.sign_in", None, None, "refused", 303),  # the form's answer is a redirect back to the sign-in
    ]


def test_the_operator_exports_json_lines_by_tenant_and_date_and_verifies(service):
    data = ("--data-dir", str(service.data_dir))
    everything = _finetune("serve", "audit", *data)
    assert everything.returncode == 0, everything.stderr
    lines = [json.loads(line) for line in everything.stdout.splitlines()]
    assert [r["seq"] for r in lines] == list(range(1, len(lines) + 1))
    assert {"alice", "bob"} <= {r["tenant"] for r in lines}
    bobs = [json.loads(line) for line in _finetune("serve", "audit", "--tenant", "bob", *data).stdout.splitlines()]
    assert bobs and {r["tenant"] for r in bobs} == {"bob"}
    assert _finetune("serve", "audit", "--since", "2999-01-01", *data).stdout == ""
    bad = _finetune("serve", "audit", "--since", "yesterday", *data)
    assert bad.returncode == 1 and "--since" in bad.stderr and "Traceback" not in bad.stderr
    verified = _finetune("serve", "audit", "--verify", *data)
    assert verified.returncode == 0 and f"head {lines[-1]['seq']}:{lines[-1]['hash']}" in verified.stdout
