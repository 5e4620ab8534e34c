"""GET /metrics (scraped with prometheus_client's own parser), GET /readyz, and `--log-format json` of a real
`finetune serve` whose worker runs the stand-in trainer; /readyz's failures and /metrics without a token in-process."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families
from service_helpers import Server, settings_for

from finetune.service.dashboard.app import create_app
from finetune.service.storage.db import SCHEMA_VERSION, make_engine, schema_version

TOKEN = "scrape-me-9f2c"
HYPER = {"n_epochs": 1, "max_steps": 1, "val_fraction": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory, toy_model, tiny_data):
    data = tmp_path_factory.mktemp("observed") / "data"
    server = Server(data, toy_model, workers=1, fake=True,
                    extra=("--metrics-token", TOKEN, "--log-format", "json", "--heartbeat-seconds", "0.2",
                           "--price-per-million-tokens", "2", "--gpu-hour-price", "4"))  # fmt: skip
    client = OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
    upload = client.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    method = {"type": "supervised", "supervised": {"hyperparameters": HYPER}}
    job = client.fine_tuning.jobs.create(model="toy", training_file=upload.id, method=method)
    deadline = time.monotonic() + 120
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status != "succeeded" and time.monotonic() < deadline:
        assert job.status not in ("failed", "cancelled"), job.error
        time.sleep(0.2)
    assert job.status == "succeeded", server.output()[-3000:]
    yield server, client, job, upload
    server.stop()


def _get(url: str, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _scrape(base: str) -> dict[str, list]:
    status, text = _get(f"{base}/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _value(samples, name: str, **labels) -> float:
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def test_metrics_need_the_token_and_count_jobs_workers_usage_and_requests(served):
    server, client, job, upload = served
    base = server.url.removesuffix("/v1")
    assert _get(f"{base}/metrics")[0] == 401
    assert _get(f"{base}/metrics", {"Authorization": "Bearer wrong"})[0] == 401
    client.fine_tuning.jobs.retrieve(job.id)  # one request on a route with an id, before the scrape
    families = _scrape(base)
    assert _value(families["finetune_jobs"], "finetune_jobs", status="succeeded") == 1
    assert _value(families["finetune_jobs"], "finetune_jobs", status="queued") == 0
    waits = families["finetune_job_queue_wait_seconds"]
    assert _value(waits, "finetune_job_queue_wait_seconds_count") == 1
    assert _value(waits, "finetune_job_queue_wait_seconds_bucket", le="+Inf") == 1
    runs = families["finetune_job_run_duration_seconds"]
    assert _value(runs, "finetune_job_run_duration_seconds_count", status="succeeded") == 1
    assert _value(families["finetune_workers_alive"], "finetune_workers_alive") == 1
    beats = families["finetune_worker_last_heartbeat_timestamp_seconds"]
    assert len(beats) == 1 and time.time() - beats[0].value < 30
    tokens = families["finetune_trained_tokens"]
    assert _value(tokens, "finetune_trained_tokens_total", tenant="default", model="toy") == job.trained_tokens == 42
    used = _value(families["finetune_device_seconds"], "finetune_device_seconds_total", tenant="default", model="toy")
    assert used > 0
    assert _value(families["finetune_upload_bytes"], "finetune_upload_bytes_total", tenant="default") == upload.bytes
    requests = families["finetune_http_requests"]
    routes = {s.labels["route"] for s in requests}
    assert "/v1/fine_tuning/jobs/{job_id}" in routes and "/v1/files" in routes
    assert not any("ftjob-" in s.labels["route"] or "file-" in s.labels["route"] for s in requests)
    assert _value(requests, "finetune_http_requests_total", method="GET", route="/metrics", code="401") == 2
    latency = families["finetune_http_request_duration_seconds"]
    assert _value(latency, "finetune_http_request_duration_seconds_count", method="POST", route="/v1/files") == 1
    # the tenant id is the only tenant data in any label
    labels = {name for samples in families.values() for s in samples for name in s.labels}
    assert labels <= {"status", "le", "worker", "tenant", "model", "method", "route", "code"}


def test_readyz_says_ready_beside_healthz(served):
    server, *_ = served
    base = server.url.removesuffix("/v1")
    status, text = _get(f"{base}/readyz")
    answer = json.loads(text)
    assert status == 200 and answer["status"] == "ready"
    assert answer["checks"]["migrations"] == {"ok": True, "version": SCHEMA_VERSION, "head": SCHEMA_VERSION}
    assert answer["checks"]["database"] == {"ok": True} and answer["checks"]["storage"] == {"ok": True}


def test_every_line_of_serve_and_its_worker_is_a_json_object(served):
    server, _, job, _ = served
    server.stop()  # everything it and its worker had to say is written
    lines = [line for line in server.log_path.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # raises on any line that is not JSON
    assert all(isinstance(e, dict) and {"timestamp", "level", "event", "message", "process"} <= set(e) for e in entries)
    assert all(e["timestamp"].endswith("Z") and "T" in e["timestamp"] for e in entries)
    assert {e["process"] for e in entries} == {"serve", "worker"}
    mine = [e for e in entries if e["event"] == "job_event" and e.get("job_id") == job.id]
    assert all(e["tenant"] == "default" and e["process"] == "worker" for e in mine)
    messages = [e["message"] for e in mine]
    assert "Validated training file(s)" in messages and "The job has successfully completed" in messages
    done = next(e for e in mine if e["message"] == "The job has successfully completed")
    assert done["data"]["usage"]["actual"]["billed_tokens"] == 42
    access = [e for e in entries if e["event"] == "http_request" and e.get("route") == "/v1/fine_tuning/jobs/{job_id}"]
    assert access and all(e["job_id"] == job.id and e["tenant"] == "default" and e["status"] == 200 for e in access)
    assert all(e["method"] == "GET" for e in access)
    assert any(e["event"] == "server" and "Uvicorn running" in e["message"] for e in entries)


# ---------------------------------------------------------------------------------------------- in-process


@pytest.fixture
def app_client(tmp_path, toy_model):
    settings = settings_for(tmp_path / "d", toy_model)
    app = create_app(settings)
    with TestClient(app) as client:
        yield settings, app, client
    app.state.store.close()


def test_readyz_names_each_failing_check(app_client):
    settings, app, client = app_client
    assert client.get("/readyz").status_code == 200

    shutil.rmtree(settings.runs_dir)
    settings.runs_dir.write_text("")  # runs/ is a file: nothing can be written in it (even by root, unlike a chmod)
    answer = client.get("/readyz")
    assert answer.status_code == 503 and answer.json()["failing"] == ["storage"]
    assert answer.json()["checks"]["storage"]["error"].startswith("cannot write in the runs")
    assert str(settings.data_dir) not in answer.text  # no path on the server
    settings.runs_dir.unlink()
    settings.runs_dir.mkdir()

    if os.geteuid() != 0:  # root writes in a read-only folder anyway
        settings.files_dir.chmod(0o500)
        try:
            assert client.get("/readyz").json()["failing"] == ["storage"]
        finally:
            settings.files_dir.chmod(0o700)

    store = app.state.store
    with store.engine.begin() as conn:
        conn.execute(schema_version.update().values(version=SCHEMA_VERSION - 1))
    answer = client.get("/readyz")
    assert answer.status_code == 503 and answer.json()["failing"] == ["migrations"]
    assert answer.json()["checks"]["migrations"]["version"] == SCHEMA_VERSION - 1
    with store.engine.begin() as conn:
        conn.execute(schema_version.update().values(version=SCHEMA_VERSION))
    assert client.get("/readyz").status_code == 200

    working = store.engine
    store.engine = make_engine("postgresql://nobody@127.0.0.1:1/nothing")  # nothing listens on port 1
    try:
        answer = client.get("/readyz")
    finally:
        store.engine.dispose()
        store.engine = working
    assert answer.status_code == 503 and answer.json()["failing"] == ["database", "migrations"]
    assert answer.json()["checks"]["database"]["error"].startswith("the database does not answer")


def test_metrics_without_a_token_are_open_and_unmatched_paths_share_one_label(app_client):
    _, _, client = app_client
    client.get("/v1/no/such/thing/ftjob-123")
    assert client.get("/dashboard/static/js/app.js").status_code == 200
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    families = {f.name: f.samples for f in text_string_to_metric_families(answer.text)}
    routes = {s.labels["route"] for s in families["finetune_http_requests"]}
    assert "unmatched" in routes and not any("ftjob" in r for r in routes)
    assert "/dashboard/static/{path}" in routes and "/dashboard/static/js/app.js" not in routes
    assert _value(families["finetune_workers_alive"], "finetune_workers_alive") == 0
    queue = families["finetune_job_queue_wait_seconds"]
    assert _value(queue, "finetune_job_queue_wait_seconds_count") == 0  # an empty histogram, still there


def _tenants_scraped(tmp_path, toy_model, token: str | None) -> tuple[str, dict]:
    """/metrics after alice and bob each upload a file and create a job, on a server with or without a token."""
    from service_helpers import LOOPBACK

    app = create_app(settings_for(tmp_path / "d", toy_model, metrics_token=token))
    try:
        with TestClient(app, base_url=LOOPBACK) as client:
            for tenant in ("alice-corp", "bob-ltd"):
                key = {"Authorization": f"Bearer {app.state.store.create_key(tenant)[1]}"}
                upload = client.post("/v1/files", data={"purpose": "fine-tune"}, headers=key,
                                     files={"file": ("t.jsonl", b'{"messages": []}\n')})  # fmt: skip
                assert upload.status_code == 200, upload.text
                job = {"model": "toy", "training_file": upload.json()["id"]}
                assert client.post("/v1/fine_tuning/jobs", json=job, headers=key).status_code == 200
            answer = client.get("/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    finally:
        app.state.store.close()
    assert answer.status_code == 200, answer.text
    return answer.text, {f.name: f.samples for f in text_string_to_metric_families(answer.text)}


def test_open_metrics_name_no_tenant(tmp_path, toy_model):
    """Issue 35: an open /metrics listed every tenant's name and usage to anyone who reached the port. Without
    --metrics-token the tenant-labelled series are summed over all tenants (tenant="*")."""
    text, families = _tenants_scraped(tmp_path, toy_model, None)
    assert "alice-corp" not in text and "bob-ltd" not in text
    tokens = families["finetune_trained_tokens"]
    assert {s.labels["tenant"] for s in tokens} == {"*"} and len(tokens) == 1  # one series per model
    uploads = families["finetune_upload_bytes"]
    assert _value(uploads, "finetune_upload_bytes_total", tenant="*") == 2 * len(b'{"messages": []}\n')


def test_metrics_behind_the_token_keep_the_operator_s_per_tenant_series(tmp_path, toy_model):
    text, families = _tenants_scraped(tmp_path, toy_model, TOKEN)
    tenants = {s.labels["tenant"] for s in families["finetune_device_seconds"]}
    assert tenants == {"alice-corp", "bob-ltd"}
    assert _value(families["finetune_upload_bytes"], "finetune_upload_bytes_total", tenant="bob-ltd") == 17
