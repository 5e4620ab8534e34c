"""Streaming multipart upload: the `file` part goes straight to a temporary file under uploads/, counted as it
arrives (413 the moment it passes the limit), never held whole in memory; a gzip upload is then stored
decompressed (gunzip_upload, bounded like the data path's reader). The caller moves the finished file
into files/<id> and commits the row last, so a server killed mid-upload leaves only a temporary file, which
the next start removes (sweep_uploads)."""

from __future__ import annotations

import os
import secrets
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from finetune.data.read import MAX_LINE_BYTES, LineTooLong, gunzip_bounded, is_gzip
from finetune.service.api_error import APIError

MAX_FIELD_BYTES = 64 * 1024  # purpose and friends are short


@dataclass
class Upload:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    temp: Path | None = None
    size: int = 0


async def receive_upload(request: Request, uploads_dir: Path, limit: int) -> Upload:
    content_type, params = parse_options_header(request.headers.get("content-type"))
    boundary = params.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise APIError(400, "Upload as multipart/form-data with a 'file' part and a 'purpose' field.", "invalid_upload")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + MAX_FIELD_BYTES:
        raise APIError(413, f"The file is larger than this server's upload limit of {limit} bytes.", "file_too_large")

    upload = Upload()
    upload.temp = uploads_dir / f"upload-{os.getpid()}-{secrets.token_hex(8)}.part"
    out = open(upload.temp, "wb")  # noqa: SIM115 (closed in finally; the parser callbacks write to it)
    part: dict = {}

    def on_part_begin() -> None:
        part.clear()
        part.update(headers={}, name=None, filename=None, value=bytearray(), field=b"", header_value=b"")

    def on_header_field(data: bytes, start: int, end: int) -> None:
        part["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        part["header_value"] += data[start:end]

    def on_header_end() -> None:
        part["headers"][part["field"].lower()] = part["header_value"]
        part["field"], part["header_value"] = b"", b""

    def on_headers_finished() -> None:
        _, disposition = parse_options_header(part["headers"].get(b"content-disposition"))
        part["name"] = disposition.get(b"name", b"").decode("utf-8", "replace")
        filename = disposition.get(b"filename")
        part["filename"] = filename.decode("utf-8", "replace") if filename is not None else None

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if part["name"] == "file":
            upload.size += end - start
            if upload.size > limit:
                raise APIError(
                    413, f"The file is larger than this server's upload limit of {limit} bytes.", "file_too_large"
                )
            out.write(data[start:end])
        else:
            part["value"] += data[start:end]
            if len(part["value"]) > MAX_FIELD_BYTES:
                raise APIError(400, f"The form field {part['name']!r} is too long.", "invalid_upload")

    def on_part_end() -> None:
        if part["name"] == "file":
            upload.filename = part["filename"] or "upload"
        elif part["name"]:
            upload.fields[part["name"]] = part["value"].decode("utf-8", "replace")

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        await _parse(request, parser)
        out.flush()
        os.fsync(out.fileno())
    except BaseException:
        out.close()
        upload.temp.unlink(missing_ok=True)
        raise
    out.close()
    if upload.filename is None:
        upload.temp.unlink(missing_ok=True)
        raise APIError(400, "The upload has no 'file' part.", "invalid_upload", param="file")
    return upload


async def _parse(request: Request, parser: MultipartParser) -> None:
    """Feed the body to the parser; a body it cannot read (a part's headers over its limit, e.g. an 8,000-character
    file name; a wrong boundary; garbage) is the caller's mistake: 400, never a server error."""
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except FormParserError as exc:
        raise APIError(
            400, f"The upload is not a multipart/form-data body this server can read: {exc}.", "invalid_upload"
        ) from None


def gunzip_upload(upload: Upload, limit: int) -> None:
    """A gzip upload (known by its first bytes, whatever its name) is stored decompressed, so the worker and the
    dashboard read it as JSON Lines like any other; decompressed a block at a time with the data path's bound (a
    line over MAX_LINE_BYTES stops it, whatever the ratio: a gzip bomb costs a few MB) and the upload limit on
    what comes out. Errors name the file as uploaded and leave nothing behind."""
    with open(upload.temp, "rb") as handle:
        if not is_gzip(handle.read(2)):
            return
    plain = upload.temp.with_name(upload.temp.name + ".plain")
    size = 0
    try:
        with open(upload.temp, "rb") as source, open(plain, "wb") as out:
            for block in gunzip_bounded(source):
                size += len(block)
                if size > limit:
                    raise APIError(413, f"{upload.filename}: decompressed, the file is larger than this server's "
                                        f"upload limit of {limit} bytes.", "file_too_large")  # fmt: skip
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
    except LineTooLong as exc:
        plain.unlink(missing_ok=True)
        raise APIError(
            400,
            f"{upload.filename}: once decompressed, line {exc.line} passes the {MAX_LINE_BYTES // 2**20} MB a "
            "conversation may take (reading stopped there); split it into shorter conversations.",
            "invalid_file",
            "file",
        ) from None
    except (OSError, EOFError, zlib.error) as exc:
        plain.unlink(missing_ok=True)
        raise APIError(400, f"{upload.filename}: not a readable gzip file ({exc}).", "invalid_file", "file") from None
    except BaseException:
        plain.unlink(missing_ok=True)
        raise
    os.replace(plain, upload.temp)
    upload.size = size


def sweep_uploads(uploads_dir: Path) -> int:
    """At start: remove uploads left by a server process that died mid-upload (its pid is no longer alive, or is
    this process's own, reused after a restart: nothing is being uploaded yet)."""
    removed = 0
    for leftover in uploads_dir.glob("upload-*.part*"):
        pid = leftover.name.split("-")[1]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            leftover.unlink(missing_ok=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
