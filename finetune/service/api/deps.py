"""Shared route helpers: the store and the service's options from the app, list-query limits."""

from __future__ import annotations

from fastapi import Request

from finetune.service.api_error import APIError
from finetune.service.options import ServiceOptions
from finetune.service.storage.store import Store


def store_of(request: Request) -> Store:
    return request.app.state.store


def options_of(request: Request) -> ServiceOptions:
    return request.app.state.options


def check_limit(limit: int, maximum: int = 10_000) -> int:
    if not 1 <= limit <= maximum:
        raise APIError(400, f"limit must be between 1 and {maximum}, got {limit}.", "invalid_value", "limit")
    return limit
