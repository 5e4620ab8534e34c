"""How a bucket is reached: what every AWS client reads, unless the storage config says otherwise.

Left to botocore (the AWS CLI's and boto3's own library, under s3fs), exactly as those tools read them:
`AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`), `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
`AWS_DEFAULT_REGION` / `AWS_REGION`, `AWS_PROFILE` and the profiles of ~/.aws/config and ~/.aws/credentials, and a
pod's or an instance's role. The storage config, a YAML file at $FINETUNE_STORAGE_CONFIG (else
$XDG_CONFIG_HOME/finetune/storage.yaml, else ~/.config/finetune/storage.yaml), sets them for finetune alone:

    s3:
      endpoint_url: http://minio.internal:9000
      region: us-east-1
      profile: minio            # or access_key_id / secret_access_key / session_token (a Secret's env is better)
      checksums: when_required  # when_supported: a CRC on every upload (boto3 >= 1.36's default; R2, MinIO may refuse)
      part_size_mb: 64          # multipart uploads: parts of this size, above it
      max_concurrency: 8        # files (and parts) in flight at once
      connect_timeout_s: 10
      read_timeout_s: 60
      max_attempts: 5           # botocore's standard retries
      buckets:
        other-bucket: {endpoint_url: https://account.r2.cloudflarestorage.com, region: auto}

`checksums` defaults to `when_required` (the behaviour of every AWS client before boto3 1.36): R2, older MinIO
and other S3-compatible servers refuse the CRC headers the newer default sends on every upload. Integrity is the
manifest's SHA-256 either way: each checkpoint and published folder lists it for every file, checked after a
download. `AWS_REQUEST_CHECKSUM_CALCULATION` / `AWS_RESPONSE_CHECKSUM_VALIDATION` apply when the config is silent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from finetune.settings.errors import UserError

CONFIG_ENV = "FINETUNE_STORAGE_CONFIG"
CHECKSUMS = ("when_required", "when_supported")
_CHECKSUM_ENV = ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION")


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    checksums: str = "when_required"
    part_size_mb: int = 64
    max_concurrency: int = 8
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    max_attempts: int = 5

    @property
    def endpoint(self) -> str | None:
        """The endpoint requests go to, as far as this process can tell (for messages)."""
        return self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def config_path() -> Path:
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV]).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "finetune" / "storage.yaml"


def settings_for(bucket: str) -> S3Settings:
    """The settings of `bucket`: the config's `s3:` section, then its `buckets: {NAME: ...}` entry for it."""
    section = _read_config()
    values = {k: v for k, v in section.items() if k != "buckets"}
    per_bucket = section.get("buckets") or {}
    if not isinstance(per_bucket, dict) or not isinstance(per_bucket.get(bucket, {}), dict):
        raise UserError(f"{config_path()}: s3.buckets must map bucket names to settings")
    values |= per_bucket.get(bucket) or {}
    if "checksums" not in values and os.environ.get(_CHECKSUM_ENV[0]):
        values["checksums"] = os.environ[_CHECKSUM_ENV[0]].lower()
    return _checked(values)


def _read_config() -> dict:
    path = config_path()
    if not path.is_file():
        return {}
    import yaml  # a base dependency; imported here because only a bucket's first use reads the config

    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot read the storage config ({exc})") from None
    section = document.get("s3", {}) if isinstance(document, dict) else None
    if not isinstance(section, dict):
        raise UserError(f"{path}: the storage config must hold an `s3:` mapping")
    return section


def _checked(values: dict) -> S3Settings:
    known = {f.name: f for f in fields(S3Settings)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise UserError(f"{config_path()}: unknown storage setting(s) {', '.join(unknown)}; known: {', '.join(known)}")
    settings = S3Settings()
    for name, value in values.items():
        default = getattr(settings, name)
        try:
            value = type(default)(value) if default is not None and value is not None else value
        except (TypeError, ValueError):
            raise UserError(f"{config_path()}: s3 {name} must be a {type(default).__name__}, got {value!r}") from None
        settings = replace(settings, **{name: value})
    if settings.checksums not in CHECKSUMS:
        raise UserError(f"storage checksums must be one of {', '.join(CHECKSUMS)}, got {settings.checksums!r}")
    if settings.part_size_mb < 5:
        raise UserError(f"storage part_size_mb must be at least 5 (S3's smallest part), got {settings.part_size_mb}")
    return settings
