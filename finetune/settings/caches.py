"""The one cache root and its named folders, and the temporary folders its writers leave when they are killed.

    $FINETUNE_CACHE (else $XDG_CACHE_HOME/finetune, else ~/.cache/finetune)
        tokens/                 tokenized data (data/cache.py; --cache-dir puts it elsewhere)
        gguf/<sha256>/          GGUF files converted to safetensors (gguf_model.py), gguf/hashes/ their hashes
        bases/NAME/             the GGUF files `finetune base pull` keeps (bases.py)
        toy-base-<key>/         the demo's pretrained toy bases (toy.py)
        speed.json              this machine's measured training speed (train/speed.py)

Everything in it can be deleted; it is rebuilt when needed. `FINETUNE_CACHE_DIR`, which used to name the token
folder alone, still does for this release (with a warning): set FINETUNE_CACHE instead.

A writer builds in a hidden temporary folder and renames it into place. The folder's name carries the writer's
host and process id (`temp_folder`), so the next writer can tell one whose process is gone (`sweep_stale`): that
one is removed; one whose process is alive is left alone, unless it is older than a day (no conversion takes that
long: its process id was reused), and one from another host or an earlier version (no id) only after a day.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

log = logging.getLogger("finetune")
ROOT_ENV = "FINETUNE_CACHE"
TOKENS_ENV_DEPRECATED = "FINETUNE_CACHE_DIR"  # the token folder alone; kept for one release
STALE_S = 24 * 3600
TEMP_SUFFIX = ".partial"
_TEMP = re.compile(r"^\.(?P<stem>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.[^.]+" + re.escape(TEMP_SUFFIX) + "$")
_warned: set[str] = set()


def root() -> Path:
    """$FINETUNE_CACHE, else $XDG_CACHE_HOME/finetune, else ~/.cache/finetune."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "finetune"


def tokens() -> Path:
    """The token cache's default folder: <root>/tokens (or the deprecated $FINETUNE_CACHE_DIR)."""
    old = os.environ.get(TOKENS_ENV_DEPRECATED)
    if old:
        if TOKENS_ENV_DEPRECATED not in _warned:
            _warned.add(TOKENS_ENV_DEPRECATED)
            log.warning(
                "note: %s is deprecated and will be ignored in the next release; set %s (the one cache root: "
                "tokens go to its tokens/ folder)",
                TOKENS_ENV_DEPRECATED,
                ROOT_ENV,
            )
        return Path(old).expanduser()
    return root() / "tokens"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname() or "host")[:40]


def temp_folder(parent: Path, stem: str) -> Path:
    """A new hidden folder in `parent` named after this host and process (what `sweep_stale` reads)."""
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{stem}.{_host()}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=parent))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _age_s(path: Path) -> float:
    """Seconds since anything in the folder (its entries, not deeper) last changed."""
    try:
        newest = path.lstat().st_mtime
        if path.is_dir():
            for entry in path.iterdir():
                newest = max(newest, entry.lstat().st_mtime)
    except OSError:
        return 0.0
    return time.time() - newest


def is_stale(path: Path, legacy: re.Pattern | None = None, max_age_s: float = STALE_S) -> bool:
    """A writer's temporary folder whose writer is gone; False for anything else."""
    found = _TEMP.match(path.name)
    if found:
        if found["host"] == _host() and not _alive(int(found["pid"])):
            return True
        return _age_s(path) > max_age_s
    return bool(legacy and legacy.match(path.name)) and _age_s(path) > max_age_s


def sweep_stale(parent: Path, legacy: re.Pattern | None = None, max_age_s: float = STALE_S) -> list[Path]:
    """Remove the temporary folders in `parent` whose writers are gone (and the `legacy` names of an earlier
    version, by age alone); what was removed. Never fails: a folder it cannot remove is left for next time."""
    removed = []
    try:
        entries = [p for p in parent.iterdir() if p.name.startswith(".")]
    except OSError:
        return removed
    for path in entries:
        if is_stale(path, legacy, max_age_s):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            if not path.exists():
                removed.append(path)
    if removed:
        log.info("removed %d unfinished temporary folder(s) in %s left by a process that is gone", len(removed), parent)
    return removed


def remove_folder(folder: Path) -> None:
    """Remove a folder at once for every reader: renamed aside (a name `sweep_stale` knows) first, then deleted,
    so nothing reads a half-removed folder and a kill in between leaves only what the next sweep removes."""
    aside = folder.with_name(f".{folder.name[:16]}.{_host()}.{os.getpid()}.removing{TEMP_SUFFIX}")
    shutil.rmtree(aside, ignore_errors=True)
    folder.rename(aside)
    shutil.rmtree(aside, ignore_errors=True)
