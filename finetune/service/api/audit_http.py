"""The audit trail of the API and the dashboard: an ASGI middleware that records every write (POST, PUT, PATCH,
DELETE on a route) and every download (a GET of DOWNLOADS, or any answer sent as an attachment) once it is
answered, and before its answer leaves: a caller that has its answer finds the record already there.

What a record names comes from the route's template, not from each route: ACTIONS maps the known ones to an action
name; a route added later gets one made from its template (DELETE /v1/fine_tuning/jobs/{job_id} -> job.delete,
POST /v1/things/{id}/archive -> thing.archive). The object is the route's last path parameter, a download's
QUERY_OBJECTS parameter, or the `id` of the JSON a create answers. Who: the tenant and key id auth.py noted
when it matched the key (`request.state`), or, on a route without auth, the key the request presents.
"""

from __future__ import annotations

import json
import logging

from anyio import to_thread
from fastapi import FastAPI
from starlette.requests import Request

from finetune.service.api.audit_noise import MARK, SKIP, NoiseLimit
from finetune.service.api.auth import COOKIE, identify
from finetune.service.api.routes.audit import router
from finetune.service.storage.audit_trail import AuditLog, outcome_of

WRITES = ("POST", "PUT", "PATCH", "DELETE")
ACTIONS: dict[tuple[str, str], str] = {
    ("POST", "/v1/files"): "file.upload",
    ("DELETE", "/v1/files/{file_id}"): "file.delete",
    ("GET", "/v1/files/{file_id}/content"): "file.download",
    ("POST", "/v1/fine_tuning/jobs"): "job.create",
    ("DELETE", "/v1/fine_tuning/jobs/{job_id}"): "job.delete",
    ("POST", "/v1/fine_tuning/jobs/{job_id}/evaluations"): "evaluation.create",
    ("POST", "/v1/fine_tuning/plan"): "job.plan",
    ("DELETE", "/v1/models/{model:path}"): "model.delete",
    ("POST", "/v1/chat/completions"): "chat.completion",
    ("POST", "/v1/dashboard/session"): "session.sign_in",
    ("DELETE", "/v1/dashboard/session"): "session.sign_out",
    ("GET", "/v1/dashboard/jobs/{job_id}/download"): "model.download",
}
DOWNLOADS = {template for method, template in ACTIONS if method == "GET"}
# creates under a path parameter: the object is the `id` their answer names (the evaluation, not its job)
CREATES_UNDER = {"/v1/fine_tuning/jobs/{job_id}/evaluations"}
# a download whose object is a query parameter when given: template -> (parameter, the action then)
QUERY_OBJECTS = {"/v1/dashboard/jobs/{job_id}/download": ("checkpoint", "checkpoint.download")}
SIGNED_IN_ONLY_IF_MATCHED = {"session.sign_in"}  # answered 303 either way by a form: refused when no key matched
UNRECORDED = "audit.unrecorded"  # the first request without a valid key left out in a minute (audit_noise.py)
VERBS = {"POST": "create", "PUT": "update", "PATCH": "update", "DELETE": "delete", "GET": "download"}
HELD_BODY_MAX = 1 << 20  # a create's JSON answer is read for its id up to this size
log = logging.getLogger("finetune.service.storage.audit_trail")


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def action_for(method: str, template: str) -> str:
    """The action's name: ACTIONS', or one made from the template (the thing it acts on, then the verb)."""
    known = ACTIONS.get((method, template))
    if known:
        return known
    parts = [p for p in template.split("/") if p and p not in ("v1", "dashboard")]
    is_param = [p.startswith("{") for p in parts]
    statics = [p for p, param in zip(parts, is_param, strict=True) if not param]
    if not statics:
        return f"request.{VERBS.get(method, method.lower())}"
    if len(parts) >= 2 and not is_param[-1] and is_param[-2]:  # /things/{id}/verb
        before = [p for p in parts[:-2] if not p.startswith("{")]
        return f"{_singular(before[-1]) if before else 'request'}.{parts[-1]}"
    return f"{_singular(statics[-1])}.{VERBS.get(method, method.lower())}"


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key == name:
            return value.decode("latin-1")
    return None


def _attachment(headers) -> bool:
    return any(k.lower() == b"content-disposition" and b"attachment" in v.lower() for k, v in headers or [])


def _is_json(headers) -> bool:
    return any(k.lower() == b"content-type" and v.lower().startswith(b"application/json") for k, v in headers or [])


class AuditTrail:
    def __init__(self, app, log: AuditLog, noise: NoiseLimit | None = None) -> None:
        self.app = app
        self.log = log
        self.noise = noise or NoiseLimit()  # requests without a valid key: how many are recorded (per process)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in (*WRITES, "GET"):
            await self.app(scope, receive, send)
            return
        state: dict = {"decided": False, "recorded": False, "start": None, "body": [], "size": 0}

        async def record(status: int, answer_id: str | None) -> None:
            state["recorded"] = True
            await self._record(scope, status, answer_id)

        async def sending(message) -> None:
            if message["type"] == "http.response.start" and not state["decided"]:
                state["decided"] = True
                route = self._template(scope)
                is_write = scope["method"] in WRITES
                if route is None or not (
                    is_write or route in DOWNLOADS or (message["status"] < 400 and _attachment(message.get("headers")))
                ):
                    await send(message)
                    return
                creates = not scope.get("path_params") or (scope["method"] == "POST" and route in CREATES_UNDER)
                if is_write and creates and _is_json(message.get("headers")):
                    state["start"] = message  # a create: its answer's id is the object; held until it is read
                    return
                await record(message["status"], None)
                await send(message)
                return
            if message["type"] == "http.response.body" and state["start"] is not None:
                state["body"].append(message)
                state["size"] += len(message.get("body", b""))
                if message.get("more_body") and state["size"] <= HELD_BODY_MAX:
                    return
                start, state["start"] = state["start"], None
                await record(start["status"], self._answer_id(state["body"]))
                await send(start)
                for held in state["body"]:
                    await send(held)
                return
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if not state["recorded"] and scope["method"] in WRITES and self._template(scope) is not None:
                await record(500, None)  # Starlette answers the 500 after this (a held answer never leaves)
            raise

    @staticmethod
    def _template(scope) -> str | None:
        route = scope.get("route")
        return getattr(route, "path", None) or None

    @staticmethod
    def _answer_id(messages: list[dict]) -> str | None:
        try:
            answer = json.loads(b"".join(m.get("body", b"") for m in messages))
        except ValueError:
            return None
        found = answer.get("id") if isinstance(answer, dict) else None
        return found if isinstance(found, str) else None

    async def _record(self, scope, status: int, answer_id: str | None) -> None:
        try:
            await to_thread.run_sync(self._write, scope, status, answer_id)
        except Exception:  # the action happened: its answer goes out; the server's log says the record did not
            log.exception("could not write the audit record of %s %s", scope["method"], scope["path"])

    def _write(self, scope, status: int, answer_id: str | None) -> None:
        template = self._template(scope) or scope["path"]
        method = scope["method"]
        if "key_tenant" not in (scope.get("state") or {}) and (
            _header(scope, b"authorization") or _header(scope, b"cookie")
        ):
            identify(Request(scope))  # a route without auth (sign-out): who its key says
        noted = scope.get("state") or {}
        action, object_id = self._what(scope, template, answer_id)
        outcome = outcome_of(status)
        if action in SIGNED_IN_ONLY_IF_MATCHED and noted.get("key_tenant") is None and outcome == "ok":
            outcome = "refused"
        client = scope.get("client")
        source = client[0] if client else "unknown"
        if noted.get("key_tenant") is None:  # without a valid key: bounded (audit_noise.py), its object not kept
            verdict = self.noise.admit(source)
            if verdict == SKIP:
                return
            action = UNRECORDED if verdict == MARK else action
            object_id = f"recording resumes in {self.noise.until():.0f} s" if verdict == MARK else None
        self.log.append(
            action,
            tenant=noted.get("key_tenant"),
            key_id=noted.get("key_id"),
            object_id=object_id,
            source=source,
            via="dashboard" if self._by_cookie(scope, template) else "api",
            method=method,
            route=template,
            status=status,
            outcome=outcome,
        )

    @staticmethod
    def _what(scope, template: str, answer_id: str | None) -> tuple[str, str | None]:
        """The record's action and object: the route's last path parameter, the id a create answered, or a
        download's QUERY_OBJECTS parameter."""
        method = scope["method"]
        action = action_for(method, template)
        params = scope.get("path_params") or {}
        object_id = str(list(params.values())[-1]) if params else answer_id
        if template in CREATES_UNDER and method == "POST" and answer_id:
            object_id = answer_id
        if template in QUERY_OBJECTS:
            name, query_action = QUERY_OBJECTS[template]
            given = Request(scope).query_params.get(name)
            if given:
                action, object_id = query_action, given
        return action, object_id

    @staticmethod
    def _by_cookie(scope, template: str) -> bool:
        return not _header(scope, b"authorization") and (
            f"{COOKIE}=" in (_header(scope, b"cookie") or "") or template.startswith("/v1/dashboard/")
        )


def install_audit(app: FastAPI, log: AuditLog) -> None:
    """The middleware, and GET /v1/audit (routes/audit.py)."""
    app.state.audit = log
    app.add_middleware(AuditTrail, log=log)
    app.include_router(router)
