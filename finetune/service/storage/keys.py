"""API keys: `ftk-<id>-<secret>`. Only the sha256 of the whole key is stored, looked up by its public id
and compared in constant time. The secret has 192 random bits, so a fast hash is enough (no password
stretching needed: nothing about it can be guessed)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX = "ftk"
_DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()


def new_key() -> tuple[str, str, str]:
    """(key id, the whole key to show once, its hash to store)."""
    key_id = secrets.token_hex(6)
    key = f"{PREFIX}-{key_id}-{secrets.token_urlsafe(24)}"
    return key_id, key, hash_key(key)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def key_id_of(key: str) -> str | None:
    parts = key.split("-", 2)
    if len(parts) != 3 or parts[0] != PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


def matches(key: str, stored_hash: str | None) -> bool:
    """Constant-time; a missing key still costs one comparison, so timing does not tell ids apart."""
    return hmac.compare_digest(hash_key(key), stored_hash or _DUMMY_HASH) and stored_hash is not None
