"""The token cache: a data file is tokenized once, and every later plan, train, resume, rank or job reads it.

    key = cache_key(config, tokenizer, data_digest, val_digest)   # None: do not cache
    lengths = load_lengths(root, lengths_key(key))                # every record's whole length (Auto's limit)
    key = with_max_seq_len(key, limit)                            # the tokens fitted to the resolved limit
    entry = load_entry(root, key)                                 # None on a miss or anything suspicious
    final = store_entry(root, key, tmp_dir, meta)                 # atomic: the entry appears whole or not at all

An entry is a folder named by the sha256 of its key. The key holds everything that changes the tokens:
the sha256 of the data (and validation) file's bytes, the tokenizer (its full serialized form, chat
template and special tokens), the source code of the data path, and every setting of the run except those
declared not to touch the data (`tokens=False` in config.py: learning rate, epochs, batch, ...), with
max_seq_len as resolved (Auto's choice, not "auto"). A new setting is part of the key unless its declaration
says otherwise, so the cache errs on the side of tokenizing again.

Beside the tokens, a small entry keeps every record's whole length (`lengths_key`: the same key without
max_seq_len and truncation): Auto's max_seq_len is chosen from it, so a later run finds its tokens without
tokenizing anything.

The entry repeats its key in meta.json with the size and sha256 of each file; an entry whose key, files or
sizes do not match is ignored (and tokenized again), never trusted. Deleting the folder at any time is safe:
readers map files that stay valid until they close them, writers build in a temporary folder and rename it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path

from finetune.settings import caches
from finetune.settings.config import RunConfig
from finetune.settings.registry import tokenizing_settings

CACHE_FORMAT = 2  # bump when the layout of an entry changes (2: the records' fit, and the lengths entries)
ENV_DIR = caches.TOKENS_ENV_DEPRECATED  # the token folder alone, before the one root (FINETUNE_CACHE)
STALE_TMP_S = 6 * 3600  # a temporary folder this old belongs to a writer that died
# Settings that do not change a record's whole length: the lengths entry (what Auto's max_seq_len is chosen
# from) leaves them out, so every limit and truncation reads the same lengths.
NOT_LENGTH_SETTINGS = frozenset({"max_seq_len", "truncation"})


def cache_root(config: RunConfig) -> Path:
    """--cache-dir, else the cache root's tokens/ folder: $FINETUNE_CACHE/tokens, else
    $XDG_CACHE_HOME/finetune/tokens (~/.cache/finetune/tokens); caches.py (the deprecated $FINETUNE_CACHE_DIR too)."""
    chosen = getattr(config, "cache_dir", None)
    return Path(chosen).expanduser() if chosen else caches.tokens()


def tokenizer_fingerprint(tokenizer) -> str | None:
    """sha256 of everything in the tokenizer that decides tokens; None when it cannot be serialized whole."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None  # a slow (Python) tokenizer: no complete serialized form to trust
    digest = hashlib.sha256()
    for part in (
        type(tokenizer).__name__,
        backend.to_str(),
        str(getattr(tokenizer, "chat_template", None)),
        json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str),
    ):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def code_fingerprint() -> str:
    """sha256 of the data path's source (finetune/data/**/*.py): a code change retokenizes."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(config: RunConfig, tokenizer, data_digest: str, val_digest: str | None) -> dict | None:
    """The key of this run's tokenized data, or None when it cannot be keyed safely (do not cache)."""
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is None:
        return None
    settings = {name: getattr(config, name) for name in tokenizing_settings()}
    return {
        "format": CACHE_FORMAT,
        "code": code_fingerprint(),
        "data_sha256": data_digest,
        "val_file_sha256": val_digest,
        "tokenizer": fingerprint,
        "settings": json.loads(json.dumps(settings, default=str)),
    }


def with_max_seq_len(key: dict, max_seq_len: int) -> dict:
    """`key` (a `cache_key`) for tokens fitted to `max_seq_len` as resolved."""
    return key | {"settings": key["settings"] | {"max_seq_len": max_seq_len}}


def lengths_key(key: dict) -> dict:
    """The key of the records' whole lengths: `key` (a `cache_key`) without the settings that do not change them."""
    settings = {k: v for k, v in key["settings"].items() if k not in NOT_LENGTH_SETTINGS}
    return key | {"settings": settings, "kind": "lengths"}


def load_lengths(root: Path, key: dict):
    """The whole lengths stored under `key` (an int64 array), or None."""
    import numpy as np

    hit = load_entry(root, key)
    if hit is None:
        return None
    try:
        return np.load(hit[0] / "lengths.npy")
    except (OSError, ValueError):
        return None


def store_lengths(root: Path, key: dict, lengths) -> None:
    """Keep the whole lengths (a few bytes a record) under `key`; nothing when the cache is not writable."""
    import numpy as np

    if load_entry(root, key) is not None:
        return
    tmp = new_tmp_dir(root)
    if tmp is None:
        return
    np.save(tmp / "lengths.npy", np.asarray(lengths, dtype=np.int64))
    if store_entry(root, key, tmp, {}) is None:
        shutil.rmtree(tmp, ignore_errors=True)


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def entry_dir(root: Path, key: dict) -> Path:
    return root / key_digest(key)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def new_tmp_dir(root: Path) -> Path | None:
    """A private folder to build an entry in, or None when the cache location is not writable."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(root)
        tmp = root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        return tmp
    except OSError:
        return None


def _remove_stale_tmp(root: Path) -> None:
    now = time.time()
    for tmp in root.glob(".tmp-*"):
        try:
            if now - tmp.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            continue


def store_entry(root: Path, key: dict, tmp: Path, meta: dict) -> Path | None:
    """Seal `tmp` (its files listed with size and sha256 in meta.json) and move it into place atomically.

    Returns the entry's folder, or None when it could not be stored (the caller uses `tmp` as it is).
    Another process that stored the same key first wins: its entry is as good as ours.
    """
    final = entry_dir(root, key)
    try:
        files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(tmp.iterdir())}
        content = {"key": key, "files": files, "meta": meta, "created": time.time()}
        (tmp / "meta.json").write_text(json.dumps(content, indent=1), encoding="utf-8")
        if final.exists() and load_entry(root, key) is None:
            shutil.rmtree(final)  # an entry we do not trust (damaged, or another key's): ours replaces it
        os.replace(tmp, final)  # atomic; fails when `final` exists and is not empty
    except OSError:
        if load_entry(root, key) is not None:  # another process stored it first
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        return None
    return final


def load_entry(root: Path, key: dict, check_content: bool = False) -> tuple[Path, dict] | None:
    """(folder, meta) of the entry for `key`, or None when it is missing or does not match in any way.

    Always checked: the stored key equals `key`, and every listed file exists with its size. With
    `check_content`, also every file's sha256 (reads every byte: ~1 s per GB).
    """
    folder = entry_dir(root, key)
    try:
        content = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if content.get("key") != key:
            return None
        for name, facts in content["files"].items():
            path = folder / name
            if path.stat().st_size != facts["size"]:
                return None
            if check_content and _sha256(path) != facts["sha256"]:
                return None
        os.utime(folder / "meta.json")  # last use, for whoever prunes the cache by age
        return folder, content["meta"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
