"""Who is calling: one dependency for every route but /healthz. The key comes from `Authorization: Bearer <key>`
or from the dashboard's HttpOnly SameSite=Strict cookie `finetune_key`; the answer is the tenant."""

from __future__ import annotations

from fastapi import Request

from finetune.service.errors import APIError

COOKIE = "finetune_key"


def _presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    return request.cookies.get(COOKIE) or None


def current_tenant(request: Request) -> str:
    key = _presented_key(request)
    tenant = request.app.state.store.tenant_for_key(key) if key else None
    if tenant is None:
        # never echo the key: the message is the same for a missing, malformed, unknown or revoked one
        raise APIError(401, "Missing or invalid API key. Send it as 'Authorization: Bearer <key>'.", "invalid_api_key")
    return tenant
