"""`--storage s3://bucket/prefix`: the service's files kept in a bucket, its data folder a copy on each machine.

The bucket holds what the data folder holds, under the same names: files/<id> (uploads, results files),
runs/<job>.plan.json and runs/<job>/ (a job's run folder: its test split, checkpoints, weights, log, report,
evaluations). The API and the workers may run on machines that share only the database and the bucket: each writes
what it makes to both (`push`), and reads a file from its copy, fetched from the bucket when it lacks it or the bucket
has a newer one (`pull`, `pull_run`). The trainers of a job write its run folder in the bucket themselves
(train/remote_run.py), wherever they run. Deleting removes both (deletion.py). Caches (tokens) stay on each machine.

Without --storage none of this runs: `enabled(options)` is False and every function returns at once.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from finetune.bucket.inputs import publish_folder
from finetune.bucket.remote import Remote
from finetune.bucket.uri import join, slug
from finetune.service.options import ServiceOptions
from finetune.settings.fingerprint import model_identity
from finetune.settings.manifest import MANIFEST

RUN_LOGS = ("plan.json", "metrics.jsonl", "report.json", "skipped.jsonl", "loss_curve.png", "test_split.json")
WEIGHTS = ("adapter", "model")


def enabled(options: ServiceOptions) -> bool:
    return bool(options.storage)


def uri(options: ServiceOptions, path: Path) -> str:
    """The bucket's name for a path of the data folder (data_dir/runs/x -> s3://bucket/prefix/runs/x)."""
    relative = Path(path).resolve().relative_to(options.data_dir.resolve()).as_posix()
    return join(options.storage, relative)


def _split(target: str) -> tuple[Remote, str]:
    parent, _, name = target.rpartition("/")
    return Remote(parent), name


def push(options: ServiceOptions, *paths: Path) -> None:
    """Upload files (or every file of folders) of the data folder to the same names in the bucket."""
    if not enabled(options):
        return
    root = Remote(options.storage)
    files = {}
    for path in paths:
        for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            files[file] = file.resolve().relative_to(options.data_dir.resolve()).as_posix()
    root.put(files)


def pull(options: ServiceOptions, path: Path) -> Path:
    """The data folder's copy of a file, fetched from the bucket when this machine lacks it. The path."""
    if enabled(options) and not path.is_file():
        remote, name = _split(uri(options, path))
        if remote.object_size(name) is not None:
            remote.get({name: path})
    return path


def pull_run(options: ServiceOptions, job_id: str) -> Path:
    """A job's run folder as the service reads it while the job trains and after: its log, plan and report (when
    the bucket's differ in size from this copy's), and its committed checkpoints, each as its manifest alone (what
    their listing needs; `pull_weights` fetches the files). Checkpoints gone from the bucket go from the copy."""
    run = options.runs_dir / job_id
    if not enabled(options):
        return run
    remote = Remote(uri(options, run))
    listing = remote.listing()
    fresh = {n: run / n for n in RUN_LOGS if n in listing and _size(run / n) != listing[n]}
    steps = sorted({n.split("/")[1] for n in listing if n.startswith("checkpoints/") and n.endswith(f"/{MANIFEST}")})
    fresh |= {f"checkpoints/{s}/{MANIFEST}": run / "checkpoints" / s / MANIFEST for s in steps}
    remote.get({n: p for n, p in fresh.items() if not (n.endswith(MANIFEST) and p.is_file())})
    kept = set(steps)
    for folder in (run / "checkpoints").glob("step-*") if (run / "checkpoints").is_dir() else []:
        if folder.name not in kept:
            shutil.rmtree(folder, ignore_errors=True)
    return run


def pull_weights(options: ServiceOptions, job_id: str, name: str | None = None) -> Path | None:
    """The final weights (adapter/ or model/), or one folder of the run (checkpoints/step-N), complete on this
    machine: fetched from the bucket when the copy lacks a file of it. The folder, or None when there is none."""
    run = options.runs_dir / job_id
    if not enabled(options):
        return None
    remote = Remote(uri(options, run))
    names = [name] if name else list(WEIGHTS)
    listing = remote.listing()
    for folder in names:
        inside = {n: run / n for n in listing if n.startswith(f"{folder}/")}
        if inside:
            remote.get({n: p for n, p in inside.items() if _size(p) != listing[n]})
            return run / folder
    return None


def _size(path: Path) -> int | None:
    return path.stat().st_size if path.is_file() else None


def publish_base(options: ServiceOptions, location: str) -> str:
    """A registered base model's folder in the bucket, uploaded once (models/<name>-<hash of its identity>), for the
    nodes that train on it; a hub id is left as it is (each node reads its own hub cache)."""
    folder = Path(location)
    if not folder.is_dir():
        return location
    identity = model_identity(str(folder))
    target = join(options.storage, "models", slug(f"{folder.name}:{identity.get('sha256')}"))
    return publish_folder(folder, target)


def remote_bytes(options: ServiceOptions, path: Path) -> int | None:
    """Bytes the bucket holds under a path of the data folder (an object, or every object below it); None if none."""
    if not enabled(options):
        return None
    target = uri(options, path)
    remote, name = _split(target)
    below = remote.listing(name)
    return sum(below.values()) if below else remote.object_size(name)


def remove(target: str) -> None:
    """Delete the object `target`, or every object under it."""
    remote, name = _split(target)
    remote.remove(name)


def let_go(options: ServiceOptions, job: dict, uploads: list[Path]) -> None:
    """A worker's copies of an ended job's files, gone from its machine: its trainer logs go to the bucket first
    (logs/…, where deletion finds them), then the run folder's copy, the plan and the uploads it fetched. What
    stays is in the bucket alone, which every machine's DELETE reaches."""
    if not enabled(options):
        return
    logs = sorted(options.logs_dir.glob(f"{job['id']}-*"))
    push(options, *logs)
    run = options.runs_dir / job["id"]
    for path in (run, options.runs_dir / f"{job['id']}.plan.json", *logs, *uploads):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def stored_logs(options: ServiceOptions, job_id: str) -> list[Path]:
    """The job's logs the bucket keeps (pushed by the workers that ran it), as paths of the data folder."""
    if not enabled(options):
        return []
    names = Remote(join(options.storage, "logs")).listing()
    return [options.logs_dir / name for name in sorted(names) if name.startswith(f"{job_id}-")]
