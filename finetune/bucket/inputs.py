"""A URI's node-local copy: what a node downloads before it trains (the data, the base model), into the cache.

    local_copy("s3://b/p/files/file-abc")       -> <cache>/inputs/file-abc-<hash>/file-abc
    local_copy("s3://b/p/models/toy-<digest>")  -> <cache>/inputs/toy-…-<hash>/folder   (a folder with a manifest)
    publish_folder(local_model, uri)            the other way: a folder and its manifest, written last, once

A copy is reused while the object is unchanged (the same manifest for a folder; the same size and ETag for a file)
and downloaded again otherwise; a folder's files are checked against its manifest (SHA-256). A folder copied here
holds `.finetune-source` with its URI, which is how the run's fingerprint names it on any node
(settings/fingerprint.py), wherever the node's cache is.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from finetune.bucket.client import filesystem, storage_error
from finetune.bucket.remote import Remote, commit_folder, download_folder
from finetune.bucket.uri import is_remote, name_of, slug
from finetune.settings import caches
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import SOURCE_FILE
from finetune.settings.manifest import MANIFEST, manifest_problem

FOLDER = "folder"
STAMP = ".stamp.json"
EPHEMERAL_ENV = "FINETUNE_EPHEMERAL"  # set by a service worker: a job's trainer keeps no copy on its node


def inputs_root() -> Path:
    return caches.root() / "inputs"


def local_copy(uri: str, home: Path | None = None) -> Path:
    """The node-local copy of `uri`: a folder committed by its manifest, or one object (see the module's doc); in
    `home` (default: the cache's inputs/<name>-<hash>)."""
    remote = Remote(uri)
    home = home or inputs_root() / slug(uri)
    caches.sweep_stale(home)
    manifest = remote.read_bytes(MANIFEST)
    if manifest is not None:
        return _folder_copy(remote, home, manifest)
    return _file_copy(remote, home)


def _folder_copy(remote: Remote, home: Path, manifest: bytes) -> Path:
    folder = home / FOLDER
    unchanged = (folder / MANIFEST).is_file() and (folder / MANIFEST).read_bytes() == manifest
    if unchanged and manifest_problem(folder, hashes=False) is None:
        return folder
    temp = caches.temp_folder(home, FOLDER)
    problem = download_folder(remote, temp / FOLDER)
    if problem:
        raise UserError(f"{remote.uri}: its copy on this node does not match its manifest: {problem}")
    (temp / FOLDER / SOURCE_FILE).write_text(remote.uri, encoding="utf-8")
    if folder.exists():
        caches.remove_folder(folder)
    with contextlib.suppress(OSError):  # another process of this node put the same copy in place meanwhile
        (temp / FOLDER).rename(folder)
    caches.remove_folder(temp)
    return folder


def _file_copy(remote: Remote, home: Path) -> Path:
    try:
        info = filesystem(remote.uri).info(remote.path)
    except FileNotFoundError:
        raise UserError(f"{remote.uri}: no such object or folder in the bucket") from None
    except Exception as exc:
        raise storage_error(exc, remote.uri, "read") from None
    stamp = {"bytes": int(info.get("size") or 0), "etag": str(info.get("ETag") or "")}
    target = home / name_of(remote.uri)
    stamp_file = home / STAMP
    same = target.is_file() and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp
    if same and target.stat().st_size == stamp["bytes"]:
        return target
    partial = home / f".{target.name}.{os.getpid()}.part"
    remote_parent = Remote(remote.uri.rpartition("/")[0])
    remote_parent.get({name_of(remote.uri): partial})
    os.replace(partial, target)
    stamp_file.write_text(json.dumps(stamp), encoding="utf-8")
    return target


def publish_folder(local: Path, uri: str) -> str:
    """Upload a folder (a base model) to `uri` once: nothing is sent when its manifest is there already. The URI."""
    remote = Remote(uri)
    if remote.read_bytes(MANIFEST) is None:
        commit_folder(local, remote)
    return uri


INPUT_SETTINGS = ("data", "val_file", "model", "general_data", "chat_template")  # what a run reads from a path


def local_inputs(values: dict[str, object], out: str | Path | None = None) -> dict[str, str]:
    """Those of `values` that are bucket URIs, as the paths of this node's copies (downloaded when needed). With
    $FINETUNE_EPHEMERAL (a service job's trainer), the data goes into OUT/.inputs, removed with the run's copy;
    the model stays in the cache."""
    scratch = Path(out) / ".inputs" if out is not None and os.environ.get(EPHEMERAL_ENV) else None
    return {
        name: str(local_copy(value, scratch / slug(value) if scratch and name != "model" else None))
        for name, value in values.items()
        if is_remote(value)
    }


def read_text(location: str | Path) -> str:
    """A local file's text, or a bucket object's; OSError when there is none."""
    if not is_remote(location):
        return Path(location).read_text(encoding="utf-8")
    data = Remote(str(location)).read_bytes("")
    if data is None:
        raise FileNotFoundError(f"no object {location}")
    return data.decode("utf-8")
