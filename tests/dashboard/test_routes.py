"""The dashboard's /v1/dashboard routes in-process (no browser): sign-in cookie, tenant isolation, the curve of a
10,000-step run, progress, the final-weights download and the file preview."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from finetune.service.dashboard.app import create_app  # noqa: E402
from finetune.service.options import ServiceOptions  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 10_000


@pytest.fixture
def app(tmp_path, toy_model):
    settings = ServiceOptions(data_dir=tmp_path / "data", models={"toy": str(toy_model)})
    app = create_app(settings)
    keys = {tenant: app.state.store.create_key(tenant)[1] for tenant in ("alice", "bob")}
    app.state.test_keys = keys
    return app


def _client(app, tenant: str | None = None) -> TestClient:
    client = TestClient(app, base_url="http://127.0.0.1")
    if tenant:
        client.headers["Authorization"] = f"Bearer {app.state.test_keys[tenant]}"
    return client


def _upload(client: TestClient, path: Path) -> str:
    response = client.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": (path.name, path.read_bytes())})
    assert response.status_code == 200, response.text
    return response.json()["id"]


def _job_with_run(app, client: TestClient) -> tuple[str, Path]:
    """A job (no worker runs it) whose run folder holds a 10,000-step run, as the trainer writes it."""
    file_id = _upload(client, EXAMPLES / "train.jsonl")
    response = client.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": file_id})
    assert response.status_code == 200, response.text
    job_id = response.json()["id"]
    run = app.state.options.runs_dir / job_id
    (run / "checkpoints" / "step-010000").mkdir(parents=True)
    (run / "adapter").mkdir()
    (run / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    (run / "adapter" / "adapter_config.json").write_text("{}")
    rows = []
    for step in range(1, STEPS + 1):
        row = {
            "step": step,
            "epoch": step / 1000,
            "learning_rate": 1e-4,
            "train_loss": 2.0 - step / STEPS,
            "grad_norm": 1.0,
        }
        row["tokens_per_s"] = 1000.0
        if step == 5000:
            row["train_loss"] = 50.0  # a spike down-sampling must not hide
        if step % 1000 == 0:
            row["val_loss"] = 1.5 - step / 2 / STEPS
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = {"total_steps": STEPS, "steps_per_epoch": 1000, "epochs": 10, "tokens_processed": 1_000_000}
    (run / "plan.json").write_text(json.dumps(plan))
    report = {"best_step": 10000, "diagnosis": {"kind": "good_fit"}, "out_dir": str(run), "final_weights": str(run)}
    (run / "report.json").write_text(json.dumps(report))
    return job_id, run


def test_sign_in_sets_an_httponly_strict_cookie_that_authenticates(app):
    client = _client(app)
    assert client.get("/v1/dashboard/session").status_code == 401
    assert client.post("/v1/dashboard/session", json={"key": "ftk-nope-nope"}).status_code == 401
    response = client.post("/v1/dashboard/session", json={"key": app.state.test_keys["alice"]})
    assert response.status_code == 200 and response.json()["tenant"] == "alice"
    cookie = response.headers["set-cookie"]
    assert (
        "finetune_key=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    )
    assert client.get("/v1/dashboard/session").json()["tenant"] == "alice"  # the cookie alone signs requests
    assert client.get("/v1/fine_tuning/jobs").status_code == 200
    # signing out is an action signed by the cookie: from the page's own origin (tests/service/test_csrf.py)
    client.delete("/v1/dashboard/session", headers={"Origin": "http://127.0.0.1", "Content-Type": "application/json"})
    assert client.get("/v1/dashboard/session").status_code == 401


def test_sign_in_from_another_site_is_refused(app):
    client = _client(app)
    response = client.post(
        "/v1/dashboard/session", json={"key": app.state.test_keys["alice"]}, headers={"Origin": "https://evil.example"}
    )
    assert response.status_code == 403 and "set-cookie" not in response.headers


def test_the_page_and_its_assets_are_served_with_a_strict_policy(app):
    client = _client(app)
    page = client.get("/")
    assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/dashboard/static/vendor/uplot/LICENSE").status_code == 200
    assert client.get("/dashboard/static/js/app.js").headers["content-type"].startswith("text/javascript")


def test_curve_of_a_10000_step_run_is_downsampled_and_keeps_the_spike(app):
    alice = _client(app, "alice")
    job_id, _ = _job_with_run(app, alice)
    curve = alice.get(f"/v1/dashboard/jobs/{job_id}/curve", params={"points": 500}).json()
    assert curve["steps_logged"] == STEPS and curve["downsampled"]
    assert curve["points"] <= 2 * 500 + 2
    assert 50.0 in curve["train"]["train_loss"]
    assert curve["train"]["step"][0] == 1 and curve["train"]["step"][-1] == STEPS
    assert len(curve["val"]["step"]) == 10  # every evaluation is kept
    assert curve["checkpoints"] == [10000] and curve["best_step"] == 10000
    assert set(curve["val"]) == {"step", "epoch", "val_loss"}  # no forgetting curve in this run: no key for it


def test_curve_carries_the_forgetting_curve_beside_validation(app):
    alice = _client(app, "alice")
    job_id, run = _job_with_run(app, alice)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[0]["general_val_loss_base"] = 0.6
    for row in rows:
        if "val_loss" in row:
            row["general_val_loss"] = 0.6 + row["step"] / STEPS
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = alice.get(f"/v1/dashboard/jobs/{job_id}/curve", params={"points": 500}).json()
    val = curve["val"]
    assert val["general_val_loss_base"] == 0.6 and len(val["general_val_loss"]) == len(val["step"]) == 10
    assert val["general_val_loss"][-1] == pytest.approx(1.6) and val["step"][-1] == STEPS


def test_progress_and_download_belong_to_the_tenant(app):
    alice, bob = _client(app, "alice"), _client(app, "bob")
    job_id, _ = _job_with_run(app, alice)
    progress = alice.get("/v1/dashboard/progress", params={"job_id": [job_id, "ftjob-unknown"]}).json()["data"]
    assert list(progress) == [job_id]
    row = progress[job_id]
    assert row["step"] == STEPS and row["total_steps"] == STEPS and 2 <= len(row["spark"]) <= 42
    run = alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()
    assert run["plan"]["total_steps"] == STEPS and "out_dir" not in run["report"]  # no server paths
    download = alice.get(f"/v1/dashboard/jobs/{job_id}/download")
    assert download.headers["content-type"] == "application/zip"
    assert sorted(zipfile.ZipFile(io.BytesIO(download.content)).namelist()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert bob.get("/v1/dashboard/progress", params={"job_id": job_id}).json()["data"] == {}
    for path in ("curve", "run", "download"):
        assert bob.get(f"/v1/dashboard/jobs/{job_id}/{path}").status_code == 404


def test_preview_lists_problems_with_lines_and_renders_records(app, tmp_path):
    alice, bob = _client(app, "alice"), _client(app, "bob")
    good = (EXAMPLES / "train.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([good[0], "{not json", good[1]]) + "\n")
    bad_id = _upload(alice, bad)
    preview = alice.get(f"/v1/dashboard/files/{bad_id}/preview", params={"model": "toy"}).json()
    assert not preview["ok"] and preview["errors"][0]["line"] == 2
    assert preview["records_total"] == 2 and preview["tokens_exact"]
    spans = preview["records"][0]["spans"]
    assert any(s["weight"] > 0 for s in spans) and any(s["weight"] == 0 for s in spans)
    assert "".join(s["text"] for s in spans if s["weight"] > 0).endswith("<|im_end|>")  # end of turn is scored
    assert sum(preview["histogram"]["counts"]) == 2

    examples = _upload(alice, EXAMPLES / "train.jsonl")
    page = alice.get(f"/v1/dashboard/files/{examples}/preview", params={"offset": 355, "limit": 10}).json()
    assert page["ok"] and len(page["records"]) == 5 and not page["tokens_exact"]
    assert page["split"]["val_conversations"] == 30 and len(page["split"]["val_lines"]) == 30
    assert alice.get(f"/v1/dashboard/files/{examples}/preview", params={"model": "other"}).status_code == 400
    assert bob.get(f"/v1/dashboard/files/{examples}/preview").status_code == 404


def test_gguf_download_is_a_file_transformers_reads_and_belongs_to_the_tenant(app, toy_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from finetune.commands.cli import main
    from finetune.data.prompting import prompt_ids
    from finetune.ship.run_folder import load_for_generation, locate_weights

    alice, bob = _client(app, "alice"), _client(app, "bob")
    file_id = _upload(alice, EXAMPLES / "train.jsonl")
    job_id = alice.post("/v1/fine_tuning/jobs", json={"model": "toy", "training_file": file_id}).json()["id"]
    run = app.state.options.runs_dir / job_id  # trained where the worker would train it
    args = ["train", str(EXAMPLES / "train.jsonl"), "--model", str(toy_model), "--out", str(run), "--max-steps", "2"]
    assert main([*args, "--batch-size", "8", "--max-seq-len", "512", "--lr", "0.01", "--val-fraction", "0"]) == 0
    assert alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()["gguf"] == {"supported": True, "reason": None}

    response = alice.get(f"/v1/dashboard/jobs/{job_id}/download", params={"format": "gguf"})
    assert response.status_code == 200, response.text
    assert f'filename="{job_id}.gguf"' in response.headers["content-disposition"]
    assert response.content[:4] == b"GGUF"
    downloaded = tmp_path / "downloaded" / "model.gguf"
    downloaded.parent.mkdir()
    downloaded.write_bytes(response.content)
    read = AutoModelForCausalLM.from_pretrained(downloaded.parent, gguf_file=downloaded.name, dtype=torch.float32)
    tuned, tokenizer = load_for_generation(locate_weights(run))
    ids = torch.tensor([prompt_ids(tokenizer, [{"role": "user", "content": "Where is my order BR-1234?"}])])
    with torch.no_grad():
        assert (read(input_ids=ids).logits - tuned(input_ids=ids).logits).abs().max() <= 2e-2  # f16, the default

    cached = run / "gguf" / "final-f16.gguf"  # converted once, kept for the next download
    stamp = cached.stat().st_mtime_ns
    again = alice.get(f"/v1/dashboard/jobs/{job_id}/download", params={"format": "gguf"})
    assert again.content == response.content and cached.stat().st_mtime_ns == stamp
    assert bob.get(f"/v1/dashboard/jobs/{job_id}/download", params={"format": "gguf"}).status_code == 404
    assert alice.get(f"/v1/dashboard/jobs/{job_id}/download", params={"format": "tar"}).status_code == 400


def test_gguf_of_a_run_that_cannot_be_converted_says_why(app):
    alice = _client(app, "alice")
    job_id, _ = _job_with_run(app, alice)  # its plan.json names no base model
    gguf = alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()["gguf"]
    assert gguf["supported"] is False and "base model" in gguf["reason"]
    response = alice.get(f"/v1/dashboard/jobs/{job_id}/download", params={"format": "gguf"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "gguf_not_supported"


def test_the_run_page_gets_the_retention_check_when_it_ran(app, retention_report):
    alice = _client(app, "alice")
    job_id, run = _job_with_run(app, alice)
    assert alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()["retention"] is None
    (run / "retention.json").write_text(json.dumps(retention_report(dropped=True)))
    retention = alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()["retention"]
    assert retention["flag"] is True and retention["flagged"] == ["accuracy"]
    assert retention["accuracy"]["tuned"]["rate"] == 0 and retention["remedies"]
    assert "more than chance" in retention["message"]
    assert not {"rows", "choices", "base_model", "tuned"} & set(retention)  # no answers, no server paths
    (run / "retention.json").write_text(json.dumps(retention_report(dropped=False)))  # a later check replaces it
    assert alice.get(f"/v1/dashboard/jobs/{job_id}/run").json()["retention"]["flag"] is False


def test_preview_marks_sensitive_values_masked(app, tmp_path):
    """Each record lists its line's sensitive values (kind, role, place) and its text shows placeholders: the page
    holds no value (docs/sensitive-data.md)."""
    alice = _client(app, "alice")
    path = tmp_path / "support.jsonl"
    rows = [("My card is 4111 1111 1111 1111.", "Noted; I wrote to jane.doe@example.com."), ("Hello?", "Hi there.")]
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": u}, {"role": "assistant",
                                        "content": a}]}) + "\n" for u, a in rows))  # fmt: skip
    file_id = _upload(alice, path)
    page = alice.get(f"/v1/dashboard/files/{file_id}/preview", params={"model": "toy"}).json()
    text = json.dumps(page)
    assert "4111 1111 1111 1111" not in text and "jane.doe@example.com" not in text
    first, second = page["records"]
    assert [(f["kind"], f["role"], f["message"]) for f in first["sensitive"]] == [
        ("card", "user", 0),
        ("email", "assistant", 1),
    ]
    assert second["sensitive"] == []
    shown = "".join(s["text"] for s in first["spans"])
    assert "<CARD>" in shown and "<EMAIL>" in "".join(s["text"] for s in first["spans"] if s["weight"] > 0)
    assert page["sensitive_data"]["by_kind"] == {"card": 1, "email": 1}
    assert [w["code"] for w in page["warnings"]] == ["sensitive_data"] and page["ok"]


def test_preview_of_preference_pairs_marks_sensitive_values_masked(app, tmp_path):
    alice = _client(app, "alice")
    path = tmp_path / "prefs.jsonl"
    lines = [
        {
            "input": {"messages": [{"role": "user", "content": f"Question {i}?"}]},
            "preferred_output": [{"role": "assistant", "content": "Mail jane.doe@example.com." if i == 0 else "Yes."}],
            "non_preferred_output": [{"role": "assistant", "content": "No."}],
        }
        for i in range(3)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = alice.get(f"/v1/dashboard/files/{_upload(alice, path)}/preview").json()
    assert page["kind"] == "preference" and "jane.doe@example.com" not in json.dumps(page)
    assert [(f["kind"], f["role"]) for f in page["records"][0]["sensitive"]] == [("email", "assistant")]
    assert "<EMAIL>" in "".join(s["text"] for s in page["records"][0]["spans"])
    assert page["sensitive_data"]["by_kind"] == {"email": 1} and page["warnings"][0]["code"] == "sensitive_data"


def test_preview_warns_of_replies_stating_specifics_the_conversation_never_gave(app, tmp_path):
    """docs/answers.md: counted by kind, lines named, never a value, with the remedies."""
    alice = _client(app, "alice")
    path = tmp_path / "support.jsonl"
    rows = [("Where is my parcel?", "Order BR-46304 is out for delivery."), ("Where is BR-11111?", "BR-11111 left.")]
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": u}, {"role": "assistant",
                                        "content": a}]}) + "\n" for u, a in rows))  # fmt: skip
    page = alice.get(f"/v1/dashboard/files/{_upload(alice, path)}/preview", params={"model": "toy"}).json()
    (warning,) = [w for w in page["warnings"] if w["code"] == "invented_specifics"]
    assert warning["line"] == 1 and "1 identifier (order, ticket, account);" in warning["message"]
    assert warning["message"].startswith("1 of 2 trained replies state 1 specific the conversation never gave")
    assert "placeholder the application fills" in warning["message"] and "BR-46304" not in warning["message"]
