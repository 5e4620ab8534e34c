"""manifest.json: the size and sha256 of every file of a folder, written last, checked before the folder is used.

    write_manifest(folder)                       # after every other file (a checkpoint, a converted GGUF)
    problem = manifest_problem(folder)           # None, or what is wrong in a few words
    problem = manifest_problem(folder, hashes=False)   # sizes only: cheap enough for a listing

Checkpoints (train/checkpoint.py) and converted GGUF files (gguf_model.py) both keep one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file or a folder entry to the disk (a folder's fsync makes the names in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path, fsync: bool = True) -> None:
    """(Fsync every file, then) write the manifest of their sizes and checksums (then fsync it and the folders)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    if fsync:
        for path in files:
            fsync_path(path)
    manifest = folder / MANIFEST
    manifest.write_bytes(manifest_bytes(folder, files))
    if fsync:
        fsync_path(manifest)
        for sub in sorted({p.parent for p in files} | {folder}, key=lambda p: len(p.parts), reverse=True):
            fsync_path(sub)


def manifest_bytes(folder: Path, files: list[Path] | None = None) -> bytes:
    """The manifest of `files` (default: every file of the folder but a manifest), as it is written."""
    if files is None:
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in files}
    return json.dumps({"format": 1, "files": entries}, indent=1).encode()


class ManifestError(ValueError):
    """The manifest itself is missing or unreadable (the message says which)."""


def read_manifest(folder: Path) -> dict[str, tuple[int, str]]:
    """File name -> (bytes, sha256) as the manifest lists them; ManifestError when it is absent or damaged."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        raise ManifestError(f"it has no {MANIFEST}")
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        return {str(name): (int(meta["bytes"]), str(meta["sha256"])) for name, meta in files.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise ManifestError(f"its {MANIFEST} is damaged") from None


def files_problem(folder: Path, expected: dict[str, tuple[int, str]], hashes: bool = True) -> str | None:
    """None when every listed file is there with its size (and checksum); otherwise the first thing wrong."""
    for name, (size, _) in expected.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{name} has {actual} bytes instead of {size} (truncated or overwritten)"
    if hashes:
        for name, (_, digest) in expected.items():
            if sha256(folder / name) != digest:
                return f"{name} does not match its checksum (damaged on disk)"
    return None


def manifest_problem(folder: Path, hashes: bool = True) -> str | None:
    """None when the folder matches its manifest; otherwise what is wrong, in a few words."""
    try:
        expected = read_manifest(folder)
    except ManifestError as exc:
        return str(exc)
    return files_problem(folder, expected, hashes)
