"""The job service with `--storage s3://…` (issue 50), on SQLite and PostgreSQL, against a real S3 server on loopback:
the API and the worker on two "machines" (two data folders) that share only the database and the bucket. The twin of
test_deletion.py's first test: a real job (the toy model, `finetune train` as the worker starts it, writing the
bucket), then its file and the job deleted, and nothing of the content left, in either folder or in the bucket."""

from __future__ import annotations

import json

from service_helpers import EXAMPLES, api_client, settings_for

from finetune.bucket.uri import bucket_and_key
from finetune.service.storage.store import Store
from finetune.service.workers.worker import Worker

HELD_OUT = {"n_epochs": 1, "batch_size": 4, "max_seq_len": 256, "val_fraction": 0.2, "test_fraction": 0.25,
            "save_every": 1}  # fmt: skip


def _marked(marker: str, n: int = 24) -> bytes:
    lines = []
    for i, line in enumerate((EXAMPLES / "train.jsonl").read_text().splitlines()[:n]):
        record = json.loads(line)
        for message in record["messages"]:
            message["content"] += f" {marker}-{i}"
        lines.append(json.dumps(record))
    return ("\n".join(lines) + "\n").encode()


def _holding(s3_server, bucket: str, needle: str) -> list[str]:
    """Every object of the bucket whose bytes contain `needle`."""
    client = s3_server.client()
    found = []
    for key in s3_server.objects(bucket):
        if needle.encode() in client.get_object(Bucket=bucket, Key=key)["Body"].read():
            found.append(key)
    return found


def _files_holding(root, needle: str) -> list:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_a_job_through_the_bucket_then_deleted(database_url, tmp_path, toy_model, bucket, s3_server):
    from finetune.service.dashboard.app import create_app

    marker = "ZQX-BUCKET-7731"
    storage = f"{bucket}/svc"
    name = bucket_and_key(bucket)[0]
    api_side = settings_for(tmp_path / "api", toy_model, database=database_url, storage=storage)
    app = create_app(api_side)
    app.state.test_keys = {"alice": app.state.store.create_key("alice")[1]}
    client = api_client(app)
    answer = client.post("/v1/files", files={"file": ("support.jsonl", _marked(marker))}, data={"purpose": "fine-tune"})
    file_id = answer.json()["id"]
    assert f"svc/files/{file_id}" in s3_server.objects(name, "svc/files/")  # in the bucket before its id is answered
    body = {"model": "toy", "training_file": file_id,
            "method": {"type": "supervised", "supervised": {"hyperparameters": HELD_OUT}}}  # fmt: skip
    job_id = client.post("/v1/fine_tuning/jobs", json=body).json()["id"]

    # the worker's machine: its own data folder, the upload fetched from the bucket, the trainer writing the bucket
    worker_side = settings_for(tmp_path / "worker", toy_model, database=database_url, storage=storage,
                               heartbeat_seconds=0.2)  # fmt: skip
    worker_side.make_dirs()  # as `finetune worker` does (service/cli/from_flags.py: open_store)
    worker_store = Store(database_url)
    try:
        assert Worker(worker_side, worker_store).run_once()
    finally:
        worker_store.close()
    job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job["error"]
    stored = s3_server.objects(name, f"svc/runs/{job_id}/")
    assert {
        f"svc/runs/{job_id}/{n}" for n in ("report.json", "adapter/adapter_model.safetensors", "test.jsonl")
    } <= set(stored)
    assert any(key.endswith("/manifest.json") for key in stored if "/checkpoints/" in key)
    assert s3_server.objects(name, "svc/models/")  # the base, published once for the nodes
    assert _files_holding(tmp_path / "worker", marker) == []  # the worker's machine kept no copy once it ended

    # the API's machine never saw the run: events, checkpoints and the weights come from the bucket
    events = client.get(f"/v1/fine_tuning/jobs/{job_id}/events").json()["data"]
    assert any("step" in (event.get("data") or {}) for event in events)
    download = client.get(f"/v1/dashboard/jobs/{job_id}/download")
    assert download.status_code == 200 and download.content[:2] == b"PK"

    assert client.delete(f"/v1/files/{file_id}").status_code == 200
    assert client.delete(f"/v1/fine_tuning/jobs/{job_id}").status_code == 200
    assert s3_server.objects(name, f"svc/runs/{job_id}") == {}  # the run folder and the plan
    assert s3_server.objects(name, "svc/files/") == {}  # the upload and the results file
    assert s3_server.objects(name, f"svc/logs/{job_id}") == {}
    assert _holding(s3_server, name, marker) == []
    assert _files_holding(tmp_path / "api", marker) == [] and _files_holding(tmp_path / "worker", marker) == []
    app.state.store.close()
