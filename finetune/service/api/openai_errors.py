"""Errors in OpenAI's envelope: {"error": {"message", "type", "param", "code"}}, always application/json: an
APIError (api_error.py) as it says, FastAPI's own errors and a bug's as OpenAI's SDK expects them.

An illegal transition is 400, never 409: the SDK retries 409 (unless the answer says `x-should-retry: false`)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from finetune.service.api_error import APIError


def not_found(what: str, ident: str, param: str) -> APIError:
    return APIError(404, f"No {what} found with id {ident!r}.", code="not_found", param=param)


def envelope(status: int, message: str, kind: str, code: str | None, param: str | None, headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        return envelope(exc.status, exc.message, exc.kind, exc.code, exc.param, headers | (exc.headers or {}))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return envelope(exc.status_code, message, "invalid_request_error", code, None)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, _exc: Exception) -> JSONResponse:
        # a bug still answers in the envelope the SDK parses; the traceback goes to the server's log only
        return envelope(
            500, "The server failed to handle the request; see its log.", "server_error", "internal_error", None
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        param = ".".join(where) or None
        message = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
        return envelope(400, message, "invalid_request_error", "invalid_value", param)
