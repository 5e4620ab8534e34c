"""Every error answers in OpenAI's envelope as application/json, a bug's 500 included (the SDK parses it)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from finetune.service.api.openai_errors import install_error_handlers
from finetune.service.api_error import APIError


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/bug")
    def bug() -> dict:
        raise RuntimeError("secret detail /srv/data/file-abc")

    @app.post("/cancel")
    def cancel() -> dict:
        raise APIError(400, "Cannot cancel: it is succeeded.", "invalid_state", "fine_tuning_job_id")

    return app


def test_a_bug_is_a_500_in_the_envelope_without_its_details():
    answer = TestClient(_app(), raise_server_exceptions=False).get("/bug")
    assert answer.status_code == 500 and answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "secret" not in answer.text and "/srv" not in answer.text


def test_api_errors_and_unknown_routes_use_the_envelope():
    client = TestClient(_app())
    answer = client.post("/cancel")
    assert answer.status_code == 400
    assert answer.json() == {"error": {"message": "Cannot cancel: it is succeeded.", "type": "invalid_request_error",
                                       "param": "fine_tuning_job_id", "code": "invalid_state"}}  # fmt: skip
    missing = client.get("/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
