"""The streaming upload: a body with no declared length is counted as it arrives and refused (413) the moment
it passes the limit, without reading the rest, and leaves nothing behind."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
from starlette.requests import Request

from finetune.service.api.upload import receive_upload
from finetune.service.api_error import APIError

BOUNDARY = "b0undary"
HEAD = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="../../etc/passwd"\r\n'
    "Content-Type: application/octet-stream\r\n\r\n"
).encode()
TAIL = f"\r\n--{BOUNDARY}--\r\n".encode()


def _request(chunks: list[bytes]) -> tuple[Request, list[int]]:
    """A request whose body arrives in chunks, with no Content-Length (chunked transfer)."""
    pending, received = list(chunks), []

    async def receive() -> dict:
        body = pending.pop(0) if pending else b""
        received.append(len(body))
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    headers = [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())]
    scope = {"type": "http", "method": "POST", "path": "/v1/files", "headers": headers, "query_string": b""}
    return Request(scope, receive), received


def _run(coroutine):
    """asyncio.run in a thread of its own: another test (Playwright's sync API) may leave a loop running here."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def test_an_upload_past_the_limit_is_refused_while_streaming(tmp_path):
    chunks = [HEAD] + [b"x" * 1000] * 100 + [TAIL]  # 100 kB against a 5 kB limit
    request, received = _request(chunks)
    with pytest.raises(APIError) as raised:
        _run(receive_upload(request, tmp_path, 5000))
    assert raised.value.status == 413 and raised.value.code == "file_too_large"
    assert len(received) <= 8  # stopped a chunk past the limit, the rest never read
    assert list(tmp_path.iterdir()) == []


def test_an_upload_within_the_limit_is_kept_under_a_name_of_our_own(tmp_path):
    request, _ = _request([HEAD, b"y" * 3000, b"z" * 1000, TAIL])
    upload = _run(receive_upload(request, tmp_path, 5000))
    assert upload.size == 4000 and upload.fields == {"purpose": "fine-tune"}
    assert upload.filename == "../../etc/passwd"  # shown only
    assert upload.temp.parent == tmp_path and upload.temp.name.startswith("upload-")
    assert upload.temp.read_bytes() == b"y" * 3000 + b"z" * 1000
