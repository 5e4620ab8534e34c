"""The filesystem object of a bucket (fsspec + s3fs), and the one error a node gives when it cannot use a URI.

s3fs is the S3 implementation of fsspec, the file-system layer torch and huggingface_hub already depend on (so the
`s3` extra adds s3fs, aiobotocore and botocore, nothing else); its requests are botocore's, the AWS CLI's own, so
an endpoint, a profile, a region or a role is read exactly as `aws s3 ls` reads it. docs/storage.md says why not
pyarrow.fs or obstore.
"""

from __future__ import annotations

import os
import socket
import threading

from finetune.bucket.settings import S3Settings, settings_for
from finetune.bucket.uri import bucket_and_key
from finetune.settings.errors import UserError

INSTALL = "pip install 'finetune[s3]'"
_AWS_ENV_PREFIXES = ("AWS_",)  # a change of any of them (a test, a refreshed profile) makes a new client
_clients: dict[tuple, object] = {}
_lock = threading.Lock()


class StorageError(UserError):
    """A bucket could not be used: the message names the node, the URI and the reason."""


def node() -> str:
    """This machine's name, as a message names it (which node of a cluster could not reach the bucket)."""
    return socket.gethostname()


def filesystem(uri: str):
    """The s3fs filesystem for the bucket of `uri` (one per bucket, settings and AWS environment, per process)."""
    bucket, _ = bucket_and_key(uri)
    settings = settings_for(bucket)
    key = (bucket, settings, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_AWS_ENV_PREFIXES))))
    with _lock:
        if key not in _clients:
            _clients[key] = _new_filesystem(settings)
        return _clients[key]


def _new_filesystem(settings: S3Settings):
    try:
        import s3fs  # the optional `s3` extra: a local run never needs it
    except ImportError:
        raise UserError(f"s3:// locations need s3fs, which is not installed: {INSTALL}") from None
    config = {
        "request_checksum_calculation": settings.checksums,
        "response_checksum_validation": settings.checksums,
        "connect_timeout": settings.connect_timeout_s,
        "read_timeout": settings.read_timeout_s,
        "retries": {"max_attempts": settings.max_attempts, "mode": "standard"},
    }
    return s3fs.S3FileSystem(
        endpoint_url=settings.endpoint_url,  # None: botocore reads AWS_ENDPOINT_URL (and the profile's endpoint_url)
        key=settings.access_key_id,
        secret=settings.secret_access_key,
        token=settings.session_token,
        profile=settings.profile,
        client_kwargs={"region_name": settings.region} if settings.region else {},
        config_kwargs=config,
        max_concurrency=settings.max_concurrency,
        skip_instance_cache=True,  # this module keeps one per settings; s3fs's own cache ignores the environment
        use_listings_cache=False,  # another node writes the same prefix: a listing is never reused
    )


def part_size(uri: str) -> int:
    """Bytes per part of a multipart upload (files of at least two parts go up in parts)."""
    return settings_for(bucket_and_key(uri)[0]).part_size_mb * 2**20


def concurrency(uri: str) -> int:
    return settings_for(bucket_and_key(uri)[0]).max_concurrency


def storage_error(exc: BaseException, uri: str, doing: str) -> StorageError:
    """One line: which node could not do what with which URI, and why, in words a person can act on."""
    settings = settings_for(bucket_and_key(uri)[0])
    where = f" at {settings.endpoint}" if settings.endpoint else ""
    return StorageError(f"node {node()} cannot {doing} {uri}{where}: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300] or type(exc).__name__
    lowered = text.lower()
    if isinstance(exc, PermissionError) or "access denied" in lowered or "forbidden" in lowered:
        return (
            f"the bucket refused the credentials ({text}); check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE, or the storage config (docs/storage.md)"
        )
    if "credentials" in lowered and ("unable to locate" in lowered or "no credentials" in lowered):
        return "this node has no credentials for it: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    if isinstance(exc, FileNotFoundError) or "nosuchbucket" in lowered.replace(" ", ""):
        return f"not found ({text})"
    if isinstance(exc, OSError | ConnectionError | TimeoutError) or "connect" in lowered or "endpoint" in lowered:
        return f"the endpoint does not answer ({text}); check AWS_ENDPOINT_URL and the network"
    return f"{type(exc).__name__}: {text}"
