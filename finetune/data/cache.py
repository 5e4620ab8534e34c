"""The token cache: a data file is tokenized once, and every later plan, train, resume, rank or job reads it.

    key = cache_key(config, tokenizer, data_digest, val_digest)   # None: do not cache
    entry = load_entry(root, key)                                 # None on a miss or anything suspicious
    final = store_entry(root, key, tmp_dir, meta)                 # atomic: the entry appears whole or not at all

An entry is a folder named by the sha256 of its key. The key holds everything that changes the tokens:
the sha256 of the data (and validation) file's bytes, the tokenizer (its full serialized form, chat
template and special tokens), the source code of the data path, and every setting of the run except those
known not to touch the data (learning rate, epochs, batch, ...: NOT_DATA_SETTINGS). A new setting is part
of the key until someone adds it there, so the cache errs on the side of tokenizing again.

The entry repeats its key in meta.json with the size and sha256 of each file; an entry whose key, files or
sizes do not match is ignored (and tokenized again), never trusted. Deleting the folder at any time is safe:
readers map files that stay valid until they close them, writers build in a temporary folder and rename it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path

from finetune.config import RunConfig

CACHE_FORMAT = 1  # bump when the layout of an entry changes
ENV_DIR = "FINETUNE_CACHE_DIR"
STALE_TMP_S = 6 * 3600  # a temporary folder this old belongs to a writer that died

# Settings that never change the tokenized data: a second run that differs only in these reuses the entry.
NOT_DATA_SETTINGS = frozenset(
    {
        "data",  # replaced by the sha256 of its bytes (moving or renaming the file keeps the cache)
        "val_file",  # idem
        "model",  # replaced by the tokenizer's own fingerprint
        "trust_remote_code",
        "method",
        "lora_rank",
        "lora_alpha",
        "lora_dropout",
        "lora_train_head",
        "epochs",
        "batch_size",
        "grad_accum",
        "devices",
        "lr",
        "warmup_ratio",
        "warmup_steps",
        "last_batch",
        "schedule",
        "weight_decay",
        "max_grad_norm",
        "out",
        "eval_every",
        "save_every",
        "keep_checkpoints",
        "resume",
        "allow_changes",
        "test_fraction",  # the held-out test lines are already gone from the data file the cache hashes
        "max_steps",
        "gradient_checkpointing",
        "dtype",
        "shard",
        "packing",
        "report_to",  # where the run's metrics go (finetune/track)
        "tracker_options",
        "price_per_million_tokens",
        "gpu_hour_price",
        "gpu",
        "cache",
        "cache_dir",
    }
)


def cache_root(config: RunConfig) -> Path:
    """--cache-dir, else $FINETUNE_CACHE_DIR, else $XDG_CACHE_HOME/finetune/tokens (~/.cache/finetune/tokens)."""
    chosen = getattr(config, "cache_dir", None) or os.environ.get(ENV_DIR)
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "finetune" / "tokens"


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
    settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in NOT_DATA_SETTINGS}
    return {
        "format": CACHE_FORMAT,
        "code": code_fingerprint(),
        "data_sha256": data_digest,
        "val_file_sha256": val_digest,
        "tokenizer": fingerprint,
        "settings": json.loads(json.dumps(settings, default=str)),
    }


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
