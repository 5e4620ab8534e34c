"""Who is calling: one dependency for every route but /healthz. The key comes from `Authorization: Bearer <key>`
or from the dashboard's HttpOnly SameSite=Strict cookie `finetune_key`; the answer is the tenant.

A browser sends the cookie with any request to the server, whichever page makes it, and SameSite=Strict only
keeps other *sites* out: another port of the same host, or a sibling subdomain, is the same site. So a request
signed by the cookie that changes something (POST, PUT, PATCH, DELETE) must also come from the server's own
origin: its `Origin` header names this host and port, or, without one, `Sec-Fetch-Site: same-origin`. And it
must say `Content-Type: application/json` (which a cross-site form cannot send without a CORS preflight this
server never grants); only the upload (POST /v1/files) stays multipart. Bearer requests (the SDK) carry no
ambient credential and are not checked.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request

from finetune.service.api_error import APIError
from finetune.service.storage.keys import key_id_of

COOKIE = "finetune_key"
STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")
MULTIPART_ROUTES = {("POST", "/v1/files")}  # the upload; every other route takes JSON or nothing


def _presented_key(request: Request) -> tuple[str | None, bool]:
    """(the key, whether it came from the cookie)."""
    header = request.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip(), False
        return None, False
    return request.cookies.get(COOKIE) or None, True


def from_own_origin(request: Request) -> bool:
    """The request comes from a page of this server: its Origin's host:port is the Host it was sent to (the scheme
    is not compared: behind a TLS proxy the server may see http while the page is https), or, without an Origin,
    the browser says Sec-Fetch-Site: same-origin. Neither header: not a page of ours."""
    origin = request.headers.get("origin")
    if origin is None:
        return request.headers.get("sec-fetch-site") == "same-origin"
    host = request.headers.get("host", "").lower()
    return bool(host) and urlsplit(origin).netloc.lower() == host


def _check_cookie_request(request: Request) -> None:
    if request.method not in STATE_CHANGING:
        return
    if not from_own_origin(request):
        raise APIError(
            403,
            "This request carries the dashboard's sign-in cookie but does not come from the dashboard's own page "
            "(its Origin is another site, port or scheme); scripts and the SDK send 'Authorization: Bearer <key>'.",
            "cross_origin",
        )
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json" or (
        kind == "multipart/form-data" and (request.method, request.url.path) in MULTIPART_ROUTES
    ):
        return
    raise APIError(415, "Send the request body as application/json.", "unsupported_media_type")


def check_cookie_origin(request: Request) -> None:
    """The cookie requests' check for a route that needs no key (the dashboard's sign-out): a request carrying
    the cookie that changes something must come from the dashboard's own page (issue 35: a cross-origin DELETE of
    the session signed the browser out)."""
    key, by_cookie = _presented_key(request)
    if by_cookie and key:
        _check_cookie_request(request)


def tenant_of_key(request: Request, key: str | None) -> str | None:
    """The tenant a key belongs to (None: missing, unknown or revoked): here and at the dashboard's sign-in. A key
    that matches is noted on the request (its tenant and public id) for the audit trail (audit_http.py)."""
    tenant = request.app.state.store.tenant_for_key(key) if key else None
    if tenant is not None:
        request.state.key_tenant = tenant
        request.state.key_id = key_id_of(key)
    return tenant


def identify(request: Request) -> str | None:
    """The tenant of the key the request presents (header or cookie), noted as tenant_of_key notes it; never
    refuses (the audit trail of a route without auth)."""
    return tenant_of_key(request, _presented_key(request)[0])


def current_tenant(request: Request) -> str:
    key, by_cookie = _presented_key(request)
    tenant = tenant_of_key(request, key)
    if tenant is None:
        # never echo the key: the message is the same for a missing, malformed, unknown or revoked one
        raise APIError(401, "Missing or invalid API key. Send it as 'Authorization: Bearer <key>'.", "invalid_api_key")
    if by_cookie:
        _check_cookie_request(request)
    request.state.tenant = tenant  # for the request's log line (prometheus.py, logs.py)
    return tenant
