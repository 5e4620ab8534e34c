"""Issue 26: the SDK retries POSTs, and `Idempotency-Key` was ignored, so a lost answer could start a second
training job. Same key and body -> the same object (the first answer again); same key, another body -> 409."""

from __future__ import annotations

import httpx2
import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI
from service_helpers import LOOPBACK, api_client


def _upload(client: TestClient, data: bytes, key: str | None = None, name: str = "t.jsonl"):
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": (name, data)}, headers=headers)


def test_the_same_key_and_body_give_the_same_job_and_another_body_is_409(app, tiny_data):
    alice = api_client(app)
    file_id = _upload(alice, tiny_data.read_bytes()).json()["id"]
    body = {"model": "toy", "training_file": file_id, "seed": 3, "suffix": "x"}
    first = alice.post("/v1/fine_tuning/jobs", json=body, headers={"Idempotency-Key": "job-1"})
    alice.post(f"/v1/fine_tuning/jobs/{first.json()['id']}/pause")  # the job moves on meanwhile
    again = alice.post("/v1/fine_tuning/jobs", json=dict(reversed(body.items())), headers={"Idempotency-Key": "job-1"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()  # the first answer, as it was (same JSON in another key order: same body)
    assert [j["id"] for j in alice.get("/v1/fine_tuning/jobs").json()["data"]] == [first.json()["id"]]

    other = alice.post("/v1/fine_tuning/jobs", json=body | {"seed": 4}, headers={"Idempotency-Key": "job-1"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert other.headers["x-should-retry"] == "false"  # the SDK would retry a 409 otherwise
    assert len(alice.get("/v1/fine_tuning/jobs").json()["data"]) == 1

    # keys are the tenant's own, and without a key every request makes a job
    bob = api_client(app, "bob")
    bob_file = _upload(bob, tiny_data.read_bytes()).json()["id"]
    mine = bob.post(
        "/v1/fine_tuning/jobs", json=body | {"training_file": bob_file}, headers={"Idempotency-Key": "job-1"}
    )
    assert mine.status_code == 200 and mine.json()["id"] != first.json()["id"]
    alice.post("/v1/fine_tuning/jobs", json=body)
    alice.post("/v1/fine_tuning/jobs", json=body)
    assert len(alice.get("/v1/fine_tuning/jobs").json()["data"]) == 3


def test_a_refused_request_gives_its_key_back(app, tiny_data):
    alice = api_client(app)
    file_id = _upload(alice, tiny_data.read_bytes()).json()["id"]
    bad = alice.post(
        "/v1/fine_tuning/jobs", json={"model": "nope", "training_file": file_id}, headers={"Idempotency-Key": "k"}
    )
    assert bad.status_code == 400
    good = alice.post(
        "/v1/fine_tuning/jobs", json={"model": "nope", "training_file": file_id}, headers={"Idempotency-Key": "k"}
    )
    assert good.status_code == 400 and good.json()["error"]["code"] == "model_not_available"  # tried again, not 409


def test_the_same_upload_twice_is_one_file(app, tiny_data):
    alice = api_client(app)
    first = _upload(alice, tiny_data.read_bytes(), key="upload-1")
    again = _upload(alice, tiny_data.read_bytes(), key="upload-1")
    assert first.status_code == again.status_code == 200 and again.json() == first.json()
    assert [f["id"] for f in alice.get("/v1/files").json()["data"]] == [first.json()["id"]]
    other = _upload(alice, tiny_data.read_bytes() + b"\n", key="upload-1")
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    files_dir = app.state.options.files_dir
    assert sorted(p.name for p in files_dir.iterdir()) == [first.json()["id"]]  # nothing left by the replays
    assert list(app.state.options.uploads_dir.iterdir()) == []


class _LosesTheFirstAnswer(TestClient):
    """The network drops the answer to the first job creation after the server made the job: the SDK sees a
    timeout and retries, as it does for any POST."""

    lost = 0

    def send(self, request, **kwargs):
        response = super().send(request, **kwargs)
        if request.method == "POST" and request.url.path.endswith("/fine_tuning/jobs") and not self.lost:
            self.lost += 1
            response.close()
            raise httpx2.ReadTimeout("the answer was lost on the way", request=request)
        return response


def test_the_openai_sdk_retrying_a_lost_answer_makes_one_job(app, tiny_data):
    http = _LosesTheFirstAnswer(app, base_url=LOOPBACK)
    client = OpenAI(base_url=f"{LOOPBACK}/v1", api_key=app.state.test_keys["alice"], http_client=http, max_retries=2)
    f = client.files.create(file=("t.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="toy", training_file=f.id, extra_headers={"Idempotency-Key": "sdk-1"})
    assert http.lost == 1  # the first answer was lost, the retry got the job
    assert [j.id for j in client.fine_tuning.jobs.list().data] == [job.id]
    with pytest.raises(openai.ConflictError) as raised:  # 409, and not retried (x-should-retry: false)
        client.fine_tuning.jobs.create(
            model="toy", training_file=f.id, seed=1, extra_headers={"Idempotency-Key": "sdk-1"}
        )
    assert raised.value.code == "idempotency_key_reused"
