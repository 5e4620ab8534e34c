"""Issue 26, CSRF: a request carrying the dashboard's cookie created or cancelled a job from any Origin (SameSite=
Strict does not cover same-site pages: another port on 127.0.0.1, a sibling subdomain). A state-changing request
signed by the cookie must come from the server's own origin and, on a JSON route, say application/json; the SDK's
bearer requests are not affected."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from service_helpers import LOOPBACK as SAME  # the server's own origin

JOB = {"model": "toy", "training_file": None}


def _by_cookie(app) -> TestClient:
    client = TestClient(app, base_url=SAME)
    client.cookies.set("finetune_key", app.state.test_keys["alice"])
    return client


def _by_bearer(app) -> TestClient:
    client = TestClient(app, base_url=SAME)
    client.headers["Authorization"] = f"Bearer {app.state.test_keys['alice']}"
    return client


@pytest.fixture
def file_id(app, tiny_data) -> str:
    answer = _by_bearer(app).post(
        "/v1/files", data={"purpose": "fine-tune"}, files={"file": ("t.jsonl", tiny_data.read_bytes())}
    )
    return answer.json()["id"]


def _jobs(app) -> list[dict]:
    return _by_bearer(app).get("/v1/fine_tuning/jobs").json()["data"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://127.0.0.1:9999"},  # another port of the same host: same site, not same origin
        {"Origin": "https://evil.example"},
        {"Origin": "null"},  # a sandboxed frame, a file:// page
        {"Sec-Fetch-Site": "same-site"},  # no Origin, and the browser says: from a sibling
        {},  # no Origin and no Sec-Fetch-Site: not a page of ours
    ],
    ids=["other port", "other site", "null origin", "same-site fetch", "no origin"],
)
def test_a_cookie_request_from_another_origin_cannot_create_or_cancel_a_job(app, file_id, headers):
    cookie = _by_cookie(app)
    created = cookie.post("/v1/fine_tuning/jobs", json=JOB | {"training_file": file_id}, headers=headers)
    assert created.status_code == 403 and created.json()["error"]["code"] == "cross_origin", created.text
    assert _jobs(app) == []

    job = _by_bearer(app).post("/v1/fine_tuning/jobs", json=JOB | {"training_file": file_id}).json()
    cancelled = cookie.post(
        f"/v1/fine_tuning/jobs/{job['id']}/cancel", headers={"Content-Type": "application/json"} | headers
    )
    assert cancelled.status_code == 403
    deleted = cookie.delete(f"/v1/files/{file_id}", headers=headers)
    assert deleted.status_code == 403
    assert _jobs(app)[0]["status"] == "queued" and _by_bearer(app).get(f"/v1/files/{file_id}").status_code == 200


def test_a_cookie_request_from_the_dashboard_itself_works(app, file_id):
    cookie = _by_cookie(app)
    created = cookie.post("/v1/fine_tuning/jobs", json=JOB | {"training_file": file_id}, headers={"Origin": SAME})
    assert created.status_code == 200, created.text
    job_id = created.json()["id"]
    # a fetch that sends no Origin but says it is same-origin (Sec-Fetch-Site) is the page's own
    paused = cookie.post(f"/v1/fine_tuning/jobs/{job_id}/pause",
                         headers={"Sec-Fetch-Site": "same-origin", "Content-Type": "application/json"})  # fmt: skip
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    upload = cookie.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": ("u.jsonl", b"{}\n")},
                         headers={"Origin": SAME})  # fmt: skip
    assert upload.status_code == 200, upload.text  # the upload stays multipart, from the same origin
    assert cookie.get("/v1/fine_tuning/jobs").status_code == 200  # reading needs no Origin


def test_a_cookie_request_must_say_application_json(app, file_id):
    cookie = _by_cookie(app)
    body = json.dumps(JOB | {"training_file": file_id})
    # what a cross-site <form> can send without a preflight: text/plain, urlencoded, multipart
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        answer = cookie.post("/v1/fine_tuning/jobs", content=body, headers={"Origin": SAME, "Content-Type": kind})
        assert answer.status_code == 415 and answer.json()["error"]["code"] == "unsupported_media_type", kind
    assert _jobs(app) == []


def test_the_sdk_s_bearer_requests_are_not_affected(app, file_id):
    bearer = _by_bearer(app)
    answer = bearer.post(
        "/v1/fine_tuning/jobs", json=JOB | {"training_file": file_id}, headers={"Origin": "https://x.example"}
    )
    assert answer.status_code == 200
    plain = bearer.post(f"/v1/fine_tuning/jobs/{answer.json()['id']}/cancel")  # no Origin, no Content-Type
    assert plain.status_code == 200 and plain.json()["status"] == "cancelled"


@pytest.mark.parametrize(
    "headers",
    [{"Origin": "http://127.0.0.1:9999"}, {"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "same-site"}, {}],
    ids=["other port", "other site", "same-site fetch", "no origin"],
)
def test_a_cross_origin_sign_out_is_refused(app, headers):
    """Issue 35: DELETE /v1/dashboard/session cleared the cookie whoever asked; it is refused as the other
    cookie-signed actions are, and the page's own sign-out still works."""
    cookie = _by_cookie(app)
    refused = cookie.delete("/v1/dashboard/session", headers={"Content-Type": "application/json"} | headers)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_origin", refused.text
    assert "set-cookie" not in refused.headers
    assert cookie.get("/v1/dashboard/session").json()["tenant"] == "alice"  # still signed in

    own = cookie.delete("/v1/dashboard/session", headers={"Origin": SAME, "Content-Type": "application/json"})
    assert own.status_code == 200 and 'finetune_key=""' in own.headers["set-cookie"]
    assert "max-age=0" in own.headers["set-cookie"].lower()  # the browser drops the cookie
    # without the cookie there is nothing to sign out of, and nothing to protect
    assert TestClient(app, base_url=SAME).delete("/v1/dashboard/session").status_code == 200
