"""APIError: a request refused, as the API will answer it: an HTTP status and OpenAI's error fields.

Any layer of the service may raise it (a quota in storage, a bad `integrations` entry); api/openai_errors.py
answers it in OpenAI's envelope, {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers
