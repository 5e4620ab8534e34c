"""Issue 26's small findings of the API, in-process: the plan answer named a path on the server, events after an
unknown id returned every event, a results file was accepted as training data, DELETE /v1/models was 405, a
gzip upload failed as not_utf8, the dashboard's preview could not read preference files. Also issue 22: the job
bodies are pydantic models, and their errors keep the codes and params they always had."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from service_helpers import EXAMPLES, LOOPBACK, api_client


def _upload(client: TestClient, data: bytes, name: str = "t.jsonl"):
    return client.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": (name, data)})


def test_the_plan_answer_names_no_path_on_the_server(app, tiny_data, toy_model):
    alice = api_client(app)
    file_id = _upload(alice, tiny_data.read_bytes(), "mine.jsonl").json()["id"]
    val_id = _upload(alice, tiny_data.read_bytes(), "val.jsonl").json()["id"]
    answer = alice.post(
        "/v1/fine_tuning/plan", json={"model": "toy", "training_file": file_id, "validation_file": val_id}
    )
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert plan["object"] == "fine_tuning.plan" and plan["model"] == "toy" and plan["total_steps"] >= 1
    text = json.dumps(plan)
    for path in (str(toy_model), str(Path(toy_model).resolve()), str(app.state.options.data_dir), "/files/"):
        assert path not in text, path
    assert "val.jsonl" in plan["val_fraction_reason"]  # the validation file, named as uploaded


def test_events_after_an_unknown_id_are_an_empty_page(app, tiny_data):
    alice = api_client(app)
    file_id = _upload(alice, tiny_data.read_bytes()).json()["id"]
    job = alice.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": file_id}).json()
    other = alice.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": file_id}).json()
    events = alice.get(f"/v1/fine_tuning/jobs/{job['id']}/events").json()["data"]
    assert len(events) == 1
    for after in (
        "ftevent-999999",
        "ftevent-0",
        "garbage",
        alice.get(f"/v1/fine_tuning/jobs/{other['id']}/events").json()["data"][0]["id"],
    ):
        page = alice.get(f"/v1/fine_tuning/jobs/{job['id']}/events", params={"after": after}).json()
        assert page["data"] == [] and page["has_more"] is False, after


def test_a_results_file_is_refused_as_training_or_validation_data(app, tiny_data):
    alice = api_client(app)
    store, settings = app.state.store, app.state.options
    (settings.files_dir / "file-results").write_text("step,train_loss\n1,1.0\n")
    store.add_file("alice", "file-results", "step_metrics.csv", "fine-tune-results", 22)
    data = _upload(alice, tiny_data.read_bytes()).json()["id"]
    for route in ("/v1/fine_tuning/jobs", "/v1/fine_tuning/plan"):
        for param, body in (("training_file", {"training_file": "file-results"}),
                            ("validation_file", {"training_file": data, "validation_file": "file-results"})):  # fmt: skip
            answer = alice.post(route, json={"model": "toy", **body})
            error = answer.json()["error"]
            assert answer.status_code == 400 and (error["code"], error["param"]) == (f"invalid_{param}", param), route
            assert "results file" in error["message"]
    assert alice.get("/v1/fine_tuning/jobs").json()["data"] == []


def test_delete_a_fine_tuned_model_like_openai(app, tiny_data):
    alice, bob = api_client(app), api_client(app, "bob")
    store, settings = app.state.store, app.state.options
    file_id = _upload(alice, tiny_data.read_bytes()).json()["id"]
    job = alice.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": file_id, "suffix": "s"}).json()
    name = f"ft:toy:alice:s:{job['id']}"
    claim = store.claim("w", 30)  # a worker's run, as far as the store and the run folder go
    store.worker_update(job["id"], claim.token, "validated")
    store.worker_update(job["id"], claim.token, "start")
    store.worker_update(job["id"], claim.token, "succeed", {"fine_tuned_model": name})
    weights = settings.runs_dir / job["id"] / "adapter"
    weights.mkdir(parents=True)
    (weights / "adapter_model.safetensors").write_bytes(b"w")
    assert alice.get(f"/v1/models/{name}").status_code == 200

    assert bob.delete(f"/v1/models/{name}").status_code == 404  # another tenant's: not found
    answer = alice.delete(f"/v1/models/{name}")
    assert answer.status_code == 200 and answer.json() == {"id": name, "object": "model", "deleted": True}
    assert alice.get(f"/v1/models/{name}").status_code == 404
    assert name not in [m["id"] for m in alice.get("/v1/models").json()["data"]]
    chat = alice.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 404 and not weights.exists()
    assert alice.delete(f"/v1/models/{name}").status_code == 404  # once
    base = alice.delete("/v1/models/toy")
    assert base.status_code == 403 and base.json()["error"]["code"] == "model_not_deletable"
    assert alice.get(f"/v1/fine_tuning/jobs/{job['id']}").json()["status"] == "succeeded"  # the job stays


def test_a_gzip_upload_is_read_like_the_cli_reads_it(app, tiny_data):
    alice = api_client(app)
    answer = _upload(alice, gzip.compress(tiny_data.read_bytes()), "tiny.jsonl.gz")
    assert answer.status_code == 200, answer.text
    uploaded = answer.json()
    assert uploaded["filename"] == "tiny.jsonl.gz" and uploaded["bytes"] == tiny_data.stat().st_size
    assert alice.get(f"/v1/files/{uploaded['id']}/content").content == tiny_data.read_bytes()  # stored decompressed
    preview = alice.get(f"/v1/dashboard/files/{uploaded['id']}/preview").json()
    assert preview["ok"] and preview["records_total"] == 16
    plan = alice.post("/v1/fine_tuning/plan", json={"model": "toy", "training_file": uploaded["id"]})
    assert plan.status_code == 200 and plan.json()["examples"] >= 12  # not "not_utf8"


def test_a_gzip_bomb_upload_is_refused_and_leaves_nothing(app):
    alice = api_client(app)
    bomb = gzip.compress(b'{"messages": [{"role": "user", "content": "') + gzip.compress(b"x" * 2**20) * 64
    answer = _upload(alice, bomb, "bomb.jsonl.gz")  # 64 KB that would inflate to 64 MB on one line
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["code"] == "invalid_file"
    assert "bomb.jsonl.gz" in error["message"] and "line 1" in error["message"] and "4 MB" in error["message"]
    settings = app.state.options
    assert list(settings.files_dir.iterdir()) == [] and list(settings.uploads_dir.iterdir()) == []
    too_big = gzip.compress(b"{}\n" * 100_000)  # small lines, but more than the upload limit once decompressed
    settings.max_upload_bytes = 200_000
    answer = _upload(alice, too_big, "many.jsonl.gz")
    assert answer.status_code == 413 and "decompressed" in answer.json()["error"]["message"]
    assert list(settings.files_dir.iterdir()) == [] and list(settings.uploads_dir.iterdir()) == []


def test_the_preview_reads_a_file_of_preference_pairs(app):
    alice = api_client(app)
    pairs = (EXAMPLES / "prefs.jsonl").read_text().splitlines()[:12]
    file_id = _upload(alice, ("\n".join(pairs) + "\n").encode(), "prefs.jsonl").json()["id"]
    for model in ("", "toy"):  # estimated, then through the model's chat template
        preview = alice.get(f"/v1/dashboard/files/{file_id}/preview", params={"model": model, "limit": 5}).json()
        assert preview["kind"] == "preference" and preview["ok"], preview["errors"]
        assert preview["stats"]["pairs"] == 12 and preview["records_total"] == 12 and len(preview["records"]) == 5
        first = preview["records"][0]
        assert any(s["weight"] > 0 for s in first["spans"]) and any(s["weight"] == 0 for s in first["spans"])
        assert first["rejected_spans"] and "".join(s["text"] for s in first["rejected_spans"]).strip()
        assert preview["tokens_exact"] is bool(model)
        assert preview["split"]["train_conversations"] + preview["split"]["val_conversations"] == 12


@pytest.mark.parametrize(
    "body, status, code, param",
    [
        ({"training_file": "F"}, 400, "model_not_available", "model"),
        ({"model": "/etc/passwd", "training_file": "F"}, 400, "model_not_available", "model"),
        ({"model": "toy"}, 400, "invalid_training_file", "training_file"),
        ({"model": "toy", "training_file": 5}, 400, "invalid_training_file", "training_file"),
        ({"model": "toy", "training_file": "F", "validation_file": "file-nope"}, 400, "invalid_validation_file",
         "validation_file"),
        ({"model": "toy", "training_file": "F", "suffix": "no spaces"}, 400, "invalid_value", "suffix"),
        ({"model": "toy", "training_file": "F", "seed": True}, 400, "invalid_value", "seed"),
        ({"model": "toy", "training_file": "F", "seed": -1}, 400, "invalid_value", "seed"),
        ({"model": "toy", "training_file": "F", "metadata": {"k": 1}}, 400, "invalid_value", "metadata"),
        ({"model": "toy", "training_file": "F", "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "invalid_value",
         "metadata"),
        ({"model": "toy", "training_file": "F", "method": {"type": "reinforcement"}}, 400, "invalid_value", "method.type"),
        ({"model": "toy", "training_file": "F", "method": "supervised"}, 400, "invalid_value", "method.type"),
        ({"model": "toy", "training_file": "F", "hyperparameters": [1]}, 400, "invalid_value", "hyperparameters"),
        ({"model": "toy", "training_file": "F", "method": {"type": "supervised", "supervised": {"hyperparameters": 3}}},
         400, "invalid_value", "hyperparameters"),
        ({"model": "toy", "training_file": "F", "method": {"type": "supervised", "supervised": {"hyperparameters":
          {"n_epochs": 0}}}}, 400, "invalid_hyperparameters", "hyperparameters.n_epochs"),
        ({"model": "toy", "training_file": "F", "integrations": [], "seed": 7, "metadata": {"team": "a"},
          "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}}}, 200, None, None),
    ],
)  # fmt: skip
def test_job_bodies_keep_their_error_codes_and_params(app, tiny_data, body, status, code, param):
    alice = api_client(app)
    file_id = _upload(alice, tiny_data.read_bytes()).json()["id"]
    body = {k: (file_id if v == "F" else v) for k, v in body.items()}
    answer = alice.post("/v1/fine_tuning/jobs", json=body)
    assert answer.status_code == status, answer.text
    if code:
        assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == (code, param)
    for not_an_object in (b"[1]", b"{oops"):
        bad = alice.post("/v1/fine_tuning/jobs", content=not_an_object, headers={"Content-Type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"


def _long_export(lines: int = 16, long_lines: tuple[int, ...] = (4, 11)) -> bytes:
    """Short support conversations, those on `long_lines` with a reply longer than 128 tokens by itself."""
    rows = [
        {"messages": [{"role": "user", "content": f"question {n}"},
                      {"role": "assistant", "content": "ok " * (400 if n in long_lines else 5)}]}
        for n in range(1, lines + 1)
    ]  # fmt: skip
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_the_plan_names_dropped_lines_by_the_uploaded_name(app):
    """Issue 35: the warnings of a plan named a line of the stored upload `file-<id>:N`; the caller knows the file
    as it uploaded it, as every other message names it."""
    alice = api_client(app)
    file_id = _upload(alice, _long_export(), "support.jsonl").json()["id"]
    body = {"model": "toy", "training_file": file_id, "method": {"type": "supervised", "supervised": {
        "hyperparameters": {"max_seq_len": 128, "val_fraction": 0}}}}  # fmt: skip
    answer = alice.post("/v1/fine_tuning/plan", json=body)
    assert answer.status_code == 200, answer.text
    dropped = next(w["message"] for w in answer.json()["warnings"] if w["code"] == "dropped_examples")
    assert dropped.endswith(": support.jsonl:4, support.jsonl:11"), dropped
    assert file_id not in json.dumps(answer.json()["warnings"])


DEEP = b"[" * 100_000 + b"]" * 100_000  # nested deeper than Python's JSON parser goes (RecursionError)
BAD_SEED = {"model": "toy", "messages": [{"role": "user", "content": "Hi"}], "seed": 10**30, "max_tokens": 2}
MULTIPART = "multipart/form-data; boundary=yy"


def _malformed(app, alice: TestClient, job_id: str) -> dict:
    """Issue 42's malformed requests: each was a 500 with a traceback in the server's log."""
    long_name = {"file": ("a" * 8000 + ".jsonl", b'{"messages": []}\n')}  # MultipartParseError: header size
    as_json = {"Content-Type": "application/json"}
    return {
        "an 8,000-character file name": lambda: alice.post("/v1/files", data={"purpose": "fine-tune"}, files=long_name),
        "another boundary": lambda: alice.post(
            "/v1/files", content=b"--xx\r\n\r\n", headers={"Content-Type": MULTIPART}
        ),
        "garbage as multipart": lambda: alice.post(
            "/v1/files", content=b"\0\xff" * 64, headers={"Content-Type": MULTIPART}
        ),
        "a form field's name of 9,000 characters": lambda: alice.post(
            "/v1/files", data={"p" * 9000: "x", "purpose": "fine-tune"}, files={"file": ("a.jsonl", b"{}\n")}
        ),
        "a job body nested too deep": lambda: alice.post("/v1/fine_tuning/jobs", content=DEEP, headers=as_json),
        "an evaluation body nested too deep": lambda: alice.post(
            f"/v1/fine_tuning/jobs/{job_id}/evaluations", content=DEEP, headers=as_json
        ),
        "a chat body nested too deep": lambda: alice.post("/v1/chat/completions", content=DEEP, headers=as_json),
        "a seed past 64 bits": lambda: alice.post("/v1/chat/completions", json=BAD_SEED),
        "usage from 1e400": lambda: alice.get("/v1/usage", params={"start": "1e400"}),
        "usage from inf": lambda: alice.get("/v1/usage", params={"end": "inf"}),
        "usage from 10^23 seconds": lambda: alice.get("/v1/usage", params={"start": "9" * 23}),
    }


def test_every_malformed_request_is_a_4xx_in_openai_s_error_shape(app, tiny_data):
    alice = TestClient(app, base_url=LOOPBACK, raise_server_exceptions=False)  # a 500 is answered, not raised
    alice.headers["Authorization"] = f"Bearer {app.state.test_keys['alice']}"
    file_id = _upload(alice, tiny_data.read_bytes()).json()["id"]
    job_id = alice.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": file_id}).json()["id"]
    for name, send in _malformed(app, alice, job_id).items():
        answer = send()
        assert 400 <= answer.status_code < 500, (name, answer.status_code, answer.text)
        error = answer.json()["error"]
        assert {"message", "type", "param", "code"} <= set(error) and error["type"] == "invalid_request_error", name
    assert list(app.state.options.uploads_dir.iterdir()) == []  # a refused upload leaves no part behind
    for cursor in ("ftevent-" + "9" * 30, "ftevent-" + "0" * 20 + "9" * 20, "ftevent-²"):  # past a BIGINT; not digits
        page = alice.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"after": cursor})
        assert page.status_code == 200 and page.json()["data"] == [], (cursor, page.text)
    page = alice.get("/v1/audit", params={"after": "audit-" + "9" * 30})
    assert page.status_code == 200 and page.json()["data"] == []
