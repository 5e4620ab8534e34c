"""`POST /v1/chat/completions`, as the OpenAI SDK calls it, over the serving engine.

    router = chat_completions_router(resolver, engine=Engine(), tenant=auth_dependency)
    app.include_router(router)

`resolver(model_name, tenant)` returns the ModelLocation of a model the tenant may use, or None (or
raises ModelNotFound): the answer is then a 404 in OpenAI's error envelope, the same for a model
that does not exist and one that belongs to another tenant. `tenant` is a FastAPI dependency that
yields the caller's tenant (the job service's auth); without one, the tenant is None.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from finetune.data.team_context import with_team_system
from finetune.settings.errors import UserError
from finetune.ship.serving.engine import Completion, Engine, GenerationParams, ModelLocation

Resolver = Callable[[str, Any], ModelLocation | None]
log = logging.getLogger("finetune.ship.serving")


class ModelNotFound(LookupError):
    """The model does not exist, or the caller's tenant may not use it."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict] | None = None

    def as_chat(self) -> dict:
        content = self.content
        if isinstance(content, list):  # content parts: only text is understood
            content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    messages: list[_Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # what torch's generator takes
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: _StreamOptions | None = None

    def params(self) -> GenerationParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return GenerationParams(
            max_tokens=self.max_completion_tokens or self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=tuple(s for s in stop if s),
            seed=self.seed,
        )


def openai_error(status: int, message: str, kind: str, code: str | None = None, param: str | None = None):
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": code}}
    )


def _not_found(model: str) -> JSONResponse:
    message = f"The model `{model}` does not exist or you do not have access to it."
    return openai_error(404, message, "invalid_request_error", "model_not_found", "model")


def _usage(done: Completion) -> dict:
    total = done.prompt_tokens + done.completion_tokens
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens, "total_tokens": total}


def _completion_body(request_id: str, created: int, model: str, done: Completion) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": done.text, "refusal": None},
                "logprobs": None,
                "finish_reason": done.finish_reason,
            }
        ],
        "usage": _usage(done),
    }


def _sse_chunks(pieces: Iterator, request_id: str, created: int, model: str, include_usage: bool) -> Iterator[str]:
    """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`."""

    def chunk(delta: dict, finish: str | None, usage: dict | None = None, choices: bool = True) -> str:
        body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
        body["system_fingerprint"] = None
        body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if choices else []
        if include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    yield chunk({"role": "assistant", "content": ""}, None)
    try:
        for piece in pieces:
            if isinstance(piece, Completion):
                yield chunk({}, piece.finish_reason)
                if include_usage:
                    yield chunk({}, None, _usage(piece), choices=False)
            elif piece:
                yield chunk({"content": piece}, None)
    except Exception as exc:  # the status line is sent already: report in the stream, as OpenAI does
        error = {"error": {"message": f"generation failed: {exc}", "type": "server_error", "param": None, "code": None}}
        yield f"data: {json.dumps(error)}\n\n"
    yield "data: [DONE]\n\n"


def _no_tenant() -> None:
    return None


def chat_completions_router(
    resolver: Resolver, engine: Engine | None = None, tenant: Callable[..., Any] = _no_tenant
) -> APIRouter:
    """An APIRouter with `POST /v1/chat/completions`, answering with `engine` for models `resolver` finds."""
    engine = engine or Engine()
    router = APIRouter()

    @router.post("/v1/chat/completions", response_model=None)
    async def create_chat_completion(request: Request, caller: Any = Depends(tenant)):  # noqa: B008
        try:
            body = ChatCompletionRequest.model_validate(await request.json())
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return openai_error(400, f"{where}: {first['msg']}", "invalid_request_error", "invalid_value", where)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the JSON parser goes
            return openai_error(400, "the request body is not valid JSON", "invalid_request_error")
        try:
            location = await run_in_threadpool(resolver, body.model, caller)
        except ModelNotFound:
            location = None
        if location is None:
            return _not_found(body.model)
        messages = with_team_system([m.as_chat() for m in body.messages], location.system)  # the run's, if any
        params = body.params()
        request_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            pieces = engine.stream(location, messages, params)
            events = _sse_chunks(pieces, request_id, created, body.model, include_usage)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            done = await run_in_threadpool(engine.complete, location, messages, params)
        except UserError as exc:
            return openai_error(500, str(exc), "server_error")
        except Exception as exc:  # the SDK reads OpenAI's envelope; the traceback goes to the server's log
            log.exception("chat completion for %s failed", body.model)
            return openai_error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
        return JSONResponse(_completion_body(request_id, created, body.model, done))

    return router
