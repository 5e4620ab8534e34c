"""Locations: a local path (everything that is not a URI), or `s3://bucket/prefix`.

`Path("s3://bars/run")` is `s3:/bars/run`: a location that may be a URI is kept as a string until `is_remote` says
it is not one, and a string that looks like a mangled URI or names a scheme this version does not write is refused.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from finetune.settings.errors import UserError

SCHEME = "s3://"
_OTHER_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_MANGLED = re.compile(r"^s3:/[^/]")  # what a shell or a Path makes of s3://… (one slash)


def is_remote(location: str | Path | None) -> bool:
    """Whether `location` is a bucket URI (s3://…); every other string is a local path."""
    return isinstance(location, str) and location.startswith(SCHEME)


def check_location(location: str | Path | None, what: str) -> None:
    """A UserError for a location this version cannot use: another scheme, or an s3 URI with one slash."""
    if location is None or isinstance(location, Path):
        return
    text = str(location)
    if _MANGLED.match(text):
        raise UserError(f"{what} {text!r} is not a bucket URI (one slash after s3:): write s3://{text[4:]}")
    scheme = _OTHER_SCHEME.match(text)
    if scheme and scheme.group(1).lower() != "s3":
        raise UserError(
            f"{what} {text!r}: only local folders and s3:// URIs are supported (Google Cloud Storage, Cloudflare R2, "
            "MinIO, SeaweedFS and Ceph through their S3 API: s3://bucket/prefix with AWS_ENDPOINT_URL)"
        )
    if is_remote(text) and not bucket_and_key(text)[0]:
        raise UserError(f"{what} {text!r} names no bucket: write s3://BUCKET/PREFIX")


def bucket_and_key(uri: str) -> tuple[str, str]:
    """("bucket", "prefix/inside") of s3://bucket/prefix/inside (no trailing slash)."""
    rest = uri[len(SCHEME) :].strip("/")
    bucket, _, key = rest.partition("/")
    return bucket, key.strip("/")


def join(uri: str, *parts: str) -> str:
    """uri/part/part, with single slashes."""
    pieces = [uri.rstrip("/")] + [str(p).strip("/") for p in parts if str(p).strip("/")]
    return "/".join(pieces)


def name_of(uri: str) -> str:
    """The last part of a URI (the run's name)."""
    return uri.rstrip("/").rpartition("/")[2]


def slug(uri: str) -> str:
    """A folder name for a URI: readable, and unique by a hash of the whole URI."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", name_of(uri) or bucket_and_key(uri)[0])[:40]
    return f"{readable}-{hashlib.sha256(uri.rstrip('/').encode()).hexdigest()[:12]}"
