"""The header `Idempotency-Key` on the POSTs that create something (files, jobs): what a request with one gets. A
retried request whose answer was lost gets the first answer again instead of making a second object (the answers
are kept by storage/idempotency_keys.py).

    answer = await once(request, tenant, "POST /v1/fine_tuning/jobs", lambda: digest_json(body), make)

Same key (per tenant and route) and same body within a day: the first answer, replayed as it was (200). Same key,
another body: 409 `idempotency_key_reused` (with `x-should-retry: false`, so the SDK does not retry it). A second
request while the first still runs: 409 `idempotency_key_in_use` (which the SDK retries). No key: `make()` as usual. A request
that fails gives its key back, so a retry can try again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import Request

from finetune.service.api.deps import store_of
from finetune.service.api_error import APIError

HEADER = "idempotency-key"
MAX_KEY = 255


def digest_file(path: Path, *fields: str) -> str:
    """An upload's identity: its bytes and its form fields (purpose, name)."""
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256")
    for value in fields:
        digest.update(b"\0" + value.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def digest_json(body: Any) -> str:
    """A body's identity: the same JSON in any key order or spacing is the same body."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def once(
    request: Request,
    tenant: str,
    route: str,
    digest: Callable[[], str],
    make: Callable[[], Awaitable[tuple[str, dict]]],
) -> dict:
    """`digest()`: the body's sha256 (called only when a key is given); `make()`: (the new object's id, its JSON)."""
    key = request.headers.get(HEADER)
    if key is None:
        return (await make())[1]
    if not key.strip() or len(key) > MAX_KEY:
        raise APIError(400, f"Idempotency-Key must be 1-{MAX_KEY} characters.", "invalid_value", "Idempotency-Key")
    body_sha256 = digest()
    store = store_of(request)
    first = store.idempotency.begin(tenant, key, route, body_sha256)
    if first is not None:
        if first["body_sha256"] != body_sha256:
            raise APIError(
                409,
                "This Idempotency-Key was used with another request body; use a new key for a new request.",
                "idempotency_key_reused",
                "Idempotency-Key",
                headers={"x-should-retry": "false"},  # the SDK retries a 409 unless told not to: no retry helps
            )
        if first["response"] is None:  # a 409 the SDK retries, as it should: the first request will answer
            raise APIError(
                409,
                "A request with this Idempotency-Key is still being handled.",
                "idempotency_key_in_use",
                "Idempotency-Key",
            )
        return first["response"]
    try:
        object_id, answer = await make()
    except BaseException:
        store.idempotency.drop(tenant, key, route)
        raise
    store.idempotency.finish(tenant, key, route, object_id, answer)
    return answer
