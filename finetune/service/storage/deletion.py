"""Delete means delete: every copy of a file's content the service keeps, and all of a job's data and artifacts.

    delete_file(options, store, tenant, file_id)   the upload, its token cache entries, and in the run folders of
                                                    the ended jobs that used it: the held-out test split, the
                                                    training copy, the replay mix, skipped lines, evaluation answers
                                                    (eval.json, eval.html, retention.json), and anything their
                                                    evaluations' results quoted of it (evaluations.numbers_only);
                                                    FileInUse while a job still needs it (to train, validate or
                                                    replay on)
    delete_model(options, store, tenant, name)     a fine-tuned model's weights, checkpoints and GGUF files; ModelInUse
                                                    while an evaluation reads it
    delete_job(options, store, tenant, job_id)     an ended job's run folder (checkpoints, weights), plan, logs,
                                                    results files, token cache entries, events, checkpoint rows,
                                                    fine-tuned model; its row stays as a tombstone (tombstones.py)

A token cache entry is found by what its key holds (data/cache.py): the sha256 of the bytes it was tokenized from.
Those are the upload's bytes, or the training copy of a job that held out a test split (its plan records the
digest). The service's jobs keep their cache in DATA_DIR/cache/tokens (options.token_cache_dir); entries made in
the process's default cache folder (before that, or by the API's planning) are looked for there too.

What stays: weights trained on a file are not "unlearned" by deleting the file (delete the job, or the model); and
nothing can reach weights or files already downloaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from finetune.data.cache import cache_root
from finetune.service.options import ServiceOptions
from finetune.service.storage import bucket_copy, run_folders
from finetune.service.storage.bucket_copy import WEIGHTS
from finetune.service.storage.evaluations import Evaluations
from finetune.service.storage.store import TERMINAL, Store
from finetune.service.storage.tombstones import (
    delete_file_row_unless_needed,
    delete_fine_tuned_model,
    jobs_using_file,
    tombstone_job,
)

# what a run folder keeps of its data's content (eval/test_split.py, data/skipped.py, eval/command.py, retention.py,
# eval/replay.py: the training conversations with the replay rows, e.g. a job's own general conversations)
DERIVED_FILES = {
    "test.jsonl": "test split",
    "train.jsonl": "training copy",
    "test_split.json": "test split record",
    "skipped.jsonl": "skipped lines",
    "eval.json": "evaluation answers",
    "eval.html": "evaluation answers",
    "retention.json": "evaluation answers",
    "replay": "replay mix",
}
# what a run folder keeps of a job's general conversations (general_data): the replay mix, their rows among the team's;
# the test split and the training copy hold only the training file's
REPLAYED_FILES = ("replay",)
# called with a deleted file's id: what keeps a copy of it in memory (the dashboard's previews) forgets it
FILE_FORGETTERS: list[Callable[[str], None]] = []


@dataclass
class Removal:
    """One thing removed (or, in a dry run, to be removed): a path on the server and its bytes."""

    what: str
    path: Path
    bytes: int
    job: str | None = None
    remote: str | None = None  # --storage: the bucket's copy (bucket_copy.py), removed with it

    def shown(self) -> dict:
        """As an API caller sees it: no path on the server."""
        return {"what": self.what, "bytes": self.bytes} | ({"job": self.job} if self.job else {})


class FileInUse(Exception):
    def __init__(self, jobs: list[dict]) -> None:
        super().__init__(", ".join(job["id"] for job in jobs))
        self.jobs = jobs


class JobNotDeletable(Exception):
    """The job has not ended, or its worker is still stopping it."""


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return 0


def found(what: str, path: Path, job: str | None = None, options: ServiceOptions | None = None) -> list[Removal]:
    """[the Removal of `path`] when it exists, here or (with `options.storage`) in the bucket, else []."""
    stored = bucket_copy.remote_bytes(options, path) if options is not None and bucket_copy.enabled(options) else None
    if not path.exists() and stored is None:
        return []
    remote = bucket_copy.uri(options, path) if stored is not None else None
    return [Removal(what, path, size_of(path) if path.exists() else stored, job, remote)]


def remove(items: Iterable[Removal]) -> None:
    for item in items:
        if item.path.is_dir() and not item.path.is_symlink():
            shutil.rmtree(item.path, ignore_errors=True)
        else:
            item.path.unlink(missing_ok=True)
        if item.remote:
            bucket_copy.remove(item.remote)


def sha256_of(path: Path) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------- token cache


def cache_roots(options: ServiceOptions) -> list[Path]:
    """The service's token cache, and this process's default one (entries made before the service kept its own)."""
    roots: list[Path] = []
    for root in (options.token_cache_dir, cache_root(SimpleNamespace(cache_dir=None))):
        if root.is_dir() and root.resolve() not in roots:
            roots.append(root.resolve())
    return roots


def cache_entries(roots: list[Path], digests: set[str]) -> list[Removal]:
    """The entries (tokens, or records' lengths) tokenized from bytes of these sha256 digests."""
    found_entries = []
    for root in roots:
        for entry in sorted(root.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                key = json.loads((entry / "meta.json").read_text(encoding="utf-8"))["key"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if {key.get("data_sha256"), key.get("val_file_sha256")} & digests:
                found_entries.append(Removal("token cache", entry, size_of(entry)))
    return found_entries


def job_digests(options: ServiceOptions, job_id: str) -> set[str]:
    """The sha256 of every data file a job tokenized: as its plans record them (the upload, or the training copy
    left once a test split was held out), and that copy's own, should it have been tokenized without a plan."""
    return planned_digests(options, job_id) | {d for d in [sha256_of(options.runs_dir / job_id / "train.jsonl")] if d}


def planned_digests(options: ServiceOptions, job_id: str) -> set[str]:
    """The sha256 of the data files a job's plans record: what it tokenized (with replay, the replay mix)."""
    run = options.runs_dir / job_id
    digests: set[str | None] = set()
    for plan_path in (options.runs_dir / f"{job_id}.plan.json", run / "plan.json"):
        try:
            plan = json.loads(plan_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        digests |= {plan.get("data_sha256"), plan.get("val_sha256")}
    return {d for d in digests if isinstance(d, str)}


# ---------------------------------------------------------------------------------------------- a file


def file_removals(options: ServiceOptions, file_id: str, jobs: list[dict]) -> list[Removal]:
    """What deleting a file removes: the upload, the derived copies in the run folders of `jobs` (the ended jobs
    that used it), and the token cache entries tokenized from either. A job that only replayed the file (its
    general_data) loses only what was built from it: its replay mix and the tokens of that mix."""
    upload = options.files_dir / file_id
    digests = {d for d in [sha256_of(upload)] if d}
    items = found("upload", upload, options=options)
    for job in jobs:
        trained_on = file_id in (job["training_file"], job["validation_file"])
        digests |= job_digests(options, job["id"]) if trained_on else planned_digests(options, job["id"])
        for name in DERIVED_FILES if trained_on else REPLAYED_FILES:
            items += found(DERIVED_FILES[name], options.runs_dir / job["id"] / name, job["id"], options)
    return items + cache_entries(cache_roots(options), digests)


def delete_file(options: ServiceOptions, store: Store, tenant: str, file_id: str) -> list[Removal]:
    """Delete the tenant's file and every copy of its content (see the module's docstring); what was removed.
    FileInUse (nothing removed) while a job that has not ended uses it."""
    jobs = jobs_using_file(store.engine, tenant, file_id)
    items = file_removals(options, file_id, jobs)  # digests read before anything goes
    needing = delete_file_row_unless_needed(store.engine, tenant, file_id)
    if needing:
        raise FileInUse(needing)
    remove(items)
    trained_on = [job["id"] for job in jobs if file_id in (job["training_file"], job["validation_file"])]
    Evaluations(store.engine).keep_numbers_only(trained_on)  # results of before issue 47 quoted the team's lines
    for forget in FILE_FORGETTERS:
        forget(file_id)
    return items


# ---------------------------------------------------------------------------------------------- a model


def model_removals(options: ServiceOptions, job: dict) -> list[Removal]:
    """A fine-tuned model's files: its final weights, its checkpoints (each one is a model too), and the GGUF files
    made of either for a download (the dashboard's, RUN/gguf/)."""
    run = options.runs_dir / job["id"]
    weights = [run_folders.final_weights(run)] if not bucket_copy.enabled(options) else [run / n for n in WEIGHTS]
    items = [item for folder in weights if folder for item in found("weights", folder, job["id"], options)]
    return (
        items
        + found("checkpoints", run / "checkpoints", job["id"], options)
        + found("gguf files", run / "gguf", job["id"], options)
    )


def delete_model(options: ServiceOptions, store: Store, tenant: str, name: str) -> dict | None:
    """Delete the tenant's fine-tuned model: gone for chat completions, retrieve and list, its files and checkpoint
    rows removed; its job stays. Its job (None: no such model of the tenant's). ModelInUse (nothing changed) while an
    evaluation not ended reads it, as for deleting its job or its training file."""
    job = delete_fine_tuned_model(store.engine, tenant, name)
    if job is not None:
        remove(model_removals(options, job))
    return job


# ---------------------------------------------------------------------------------------------- a job


def job_removals(options: ServiceOptions, job: dict, with_cache: bool = True) -> list[Removal]:
    """Everything of an ended job on disk: checkpoints, weights, the rest of its run folder, its plan, its
    trainers' logs, its results files, and (`with_cache`) the token cache entries made for it."""
    job_id = job["id"]
    run = options.runs_dir / job_id
    items = model_removals(options, job)
    for folder in found("run folder", run, job_id, options):
        rest = folder.bytes - sum(item.bytes for item in items)
        items.append(dataclasses.replace(folder, bytes=max(rest, 0)))  # last: after what it holds was counted
    items += found("plan", options.runs_dir / f"{job_id}.plan.json", job_id, options)
    logs = set(options.logs_dir.glob(f"{job_id}-*")) | set(bucket_copy.stored_logs(options, job_id))  # --storage
    for log in sorted(p for p in logs if p.name.startswith(f"{job_id}-attempt-")):
        items += found("trainer log", log, job_id, options)
    for log in sorted(p for p in logs if p.name.startswith(f"{job_id}-eval-")):  # its evaluations' (evaluation.py)
        items += found("evaluation log", log, job_id, options)
    for file_id in job["result_files"] or []:
        items += found("results file", options.files_dir / file_id, job_id, options)
    if not with_cache:
        return items
    return items + cache_entries(cache_roots(options), job_digests(options, job_id))


def delete_job(options: ServiceOptions, store: Store, tenant: str, job_id: str) -> dict | None:
    """Delete an ended job's data and artifacts; its row becomes a tombstone. The row after (None: no such job of
    the tenant's). JobNotDeletable while it has not ended, or its worker has not let go of it yet."""
    job = store.get_job(tenant, job_id)
    if job is None:
        return None
    if job["status"] not in TERMINAL:
        raise JobNotDeletable(
            f"Job {job_id} is {job['status']}: cancel it first (POST /v1/fine_tuning/jobs/{job_id}/cancel), "
            "then delete it."
        )
    if job["claim_token"] is not None:
        raise JobNotDeletable(
            f"Job {job_id} is {job['status']} but its worker is still stopping it; try again shortly."
        )
    evaluating = Evaluations(store.engine).unfinished(job_id)
    if evaluating is not None:  # its command reads the weights and writes answers into the run folder
        raise JobNotDeletable(
            f"Job {job_id} is being evaluated ({evaluating['id']}, {evaluating['status']}); delete it once the "
            "evaluation has ended."
        )
    items = job_removals(options, job)
    remove(items)
    if job["deleted_at"] is not None:  # deleted before: what was left (nothing, unless a removal failed) is gone now
        return job
    removed = [item.shown() for item in items]
    if job["fine_tuned_model"] and job["model_deleted_at"] is None:
        removed.append({"what": "fine-tuned model", "id": job["fine_tuned_model"]})
    tombstone_job(store.engine, tenant, job_id, removed)
    return store.get_job(tenant, job_id)
