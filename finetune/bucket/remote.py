"""Remote: one prefix of a bucket (s3://bucket/prefix), and what finetune does with it. Every failure is one
StorageError naming this node, the URI and the reason (client.py).

    remote = Remote("s3://bars/run")
    remote.listing()                     # {"plan.json": 1234, "checkpoints/step-000010/state.json": 512, ...}
    remote.put({local_path: "plan.json"}) ; remote.get({"plan.json": local_path})
    remote.read_bytes("report.json") ; remote.write_bytes("plan.json", data) ; remote.remove("checkpoints/step-1")
    commit_folder(local, remote.child("checkpoints/step-000010"))   # every file, then manifest.json last
    committed(remote.child("checkpoints"))                            # the sub-folders whose manifest exists

A folder exists for a reader once its manifest does (settings/manifest.py: names, sizes, SHA-256 of every file):
the manifest is uploaded after every other file, and a download is checked against it, file by file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from finetune.bucket.client import concurrency, filesystem, node, part_size, storage_error
from finetune.bucket.uri import bucket_and_key, join
from finetune.settings.manifest import MANIFEST, files_problem, manifest_bytes, read_manifest


class Remote:
    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        bucket, key = bucket_and_key(self.uri)
        self.path = f"{bucket}/{key}" if key else bucket  # s3fs's name for it

    def __repr__(self) -> str:
        return f"Remote({self.uri!r})"

    def child(self, *parts: str) -> Remote:
        return Remote(join(self.uri, *parts))

    def _at(self, rel: str) -> str:
        return f"{self.path}/{rel.strip('/')}" if rel.strip("/") else self.path

    def _fail(self, exc: BaseException, doing: str, rel: str = ""):
        return storage_error(exc, join(self.uri, rel), doing)

    # ------------------------------------------------------------------ reading

    def listing(self, rel: str = "") -> dict[str, int]:
        """Every object under the prefix (or under `rel` in it): its name relative to the prefix (not to `rel`), and
        its bytes."""
        base = self._at(rel)
        try:
            found = filesystem(self.uri).find(base, detail=True, withdirs=False)
        except FileNotFoundError:
            return {}
        except Exception as exc:
            raise self._fail(exc, "list", rel) from None
        cut = len(self.path) + 1
        return {name[cut:]: int(info.get("size") or 0) for name, info in found.items() if name.startswith(base + "/")}

    def exists(self, rel: str = "") -> bool:
        try:
            return bool(filesystem(self.uri).exists(self._at(rel)))
        except Exception as exc:
            raise self._fail(exc, "read", rel) from None

    def object_size(self, rel: str = "") -> int | None:
        """The bytes of the object `rel`; None when it is no object (absent, or a prefix of others)."""
        try:
            info = filesystem(self.uri).info(self._at(rel))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._fail(exc, "read", rel) from None
        return int(info.get("size") or 0) if info.get("type") == "file" else None

    def read_bytes(self, rel: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""
        try:
            return filesystem(self.uri).cat_file(self._at(rel))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._fail(exc, "read", rel) from None

    def get(self, files: dict[str, Path]) -> None:
        """Download {name in the prefix: local path}, several at once."""
        if not files:
            return
        for local in files.values():
            Path(local).parent.mkdir(parents=True, exist_ok=True)
        names = list(files)
        try:
            filesystem(self.uri).get(
                [self._at(n) for n in names], [str(files[n]) for n in names], batch_size=concurrency(self.uri)
            )
        except Exception as exc:
            raise self._fail(exc, "download", names[0] if len(names) == 1 else "") from None

    # ------------------------------------------------------------------ writing

    def write_bytes(self, rel: str, data: bytes) -> None:
        try:
            filesystem(self.uri).pipe_file(self._at(rel), data)
        except Exception as exc:
            raise self._fail(exc, "write", rel) from None

    def put(self, files: dict[Path, str]) -> None:
        """Upload {local path: name in the prefix}, several at once; a file of two parts or more goes up in parts."""
        if not files:
            return
        locals_ = list(files)
        try:
            filesystem(self.uri).put(
                [str(p) for p in locals_], [self._at(files[p]) for p in locals_],
                batch_size=concurrency(self.uri), chunksize=part_size(self.uri),
            )  # fmt: skip
        except Exception as exc:
            raise self._fail(exc, "upload to", files[locals_[0]] if len(locals_) == 1 else "") from None

    def remove(self, rel: str = "") -> int:
        """Delete the object `rel`, or every object under it (the whole prefix when empty); how many there were."""
        inside = self.listing(rel)
        targets = [self._at(name) for name in inside]  # names relative to the prefix, `rel` included
        if rel.strip("/") and not targets and self.exists(rel):
            targets = [self._at(rel)]
        if targets:
            try:
                filesystem(self.uri).rm(targets)
            except FileNotFoundError:
                pass
            except Exception as exc:
                raise self._fail(exc, "delete", rel) from None
        return len(targets)

    def check_writable(self) -> None:
        """Write, read back and delete a small object: a node without credentials, or that cannot reach the endpoint,
        fails here with one line naming it and the URI, before a run starts."""
        probe = f".finetune-probe-{node()}"
        self.write_bytes(probe, b"ok")
        if self.read_bytes(probe) != b"ok":
            raise self._fail(OSError("a probe object did not read back"), "write", probe)
        self.remove(probe)


# ---------------------------------------------------------------------- folders committed by their manifest


def commit_folder(local: Path, remote: Remote) -> None:
    """Upload `local`: every file, then its manifest last (its own manifest.json, or one made from the files, which
    leaves the folder as it is: a user's model folder is never written to)."""
    files = {p: p.relative_to(local).as_posix() for p in sorted(local.rglob("*")) if p.is_file() and p.name != MANIFEST}
    manifest = (local / MANIFEST).read_bytes() if (local / MANIFEST).is_file() else manifest_bytes(local, list(files))
    remote.put(files)
    remote.write_bytes(MANIFEST, manifest)


def committed(remote: Remote) -> list[str]:
    """The sub-folders of `remote` whose manifest was written (their upload finished), in name order."""
    names = {name.split("/")[0] for name in remote.listing() if name.count("/") == 1 and name.endswith(MANIFEST)}
    return sorted(names)


def download_folder(remote: Remote, local: Path) -> str | None:
    """The committed folder `remote` into `local` (replaced): its manifest, then the files it lists; None when every
    file matches the manifest, else what is wrong (the folder is left for a look, and must not be used)."""
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    manifest = remote.read_bytes(MANIFEST)
    if manifest is None:
        return f"it has no {MANIFEST} (its upload never finished)"
    (local / MANIFEST).write_bytes(manifest)
    try:
        expected = read_manifest(local)
    except ValueError as exc:
        return str(exc)
    present = remote.listing()
    missing = [name for name in expected if name not in present]
    if missing:
        return f"{missing[0]} is missing (its upload never finished, or it was removed)"
    remote.get({name: local / name for name in expected})
    return files_problem(local, expected)
