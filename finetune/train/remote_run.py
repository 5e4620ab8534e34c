"""A run whose OUT is a bucket (`--out s3://bucket/prefix`): written exactly as a local run, into a node-local staging
folder under the cache, and mirrored to the bucket as it goes. The bucket holds the run; the staging folder is a copy.

    remote = RemoteRun(uri, rank)          # <cache>/runs/<name>-<hash>[-rank<r>]: this node's copy
    remote.open(resume, run_files)         # the node can write there (else one error naming it and the URI), no run
                                           # is overwritten; the run's files but its checkpoints are fetched, and on
                                           # resume the newest committed checkpoint alone
    on_step = remote.chain(on_step)        # rank 0: each new checkpoint uploaded (its manifest last), then the
                                           # bucket's older ones pruned; metrics.jsonl every few seconds
    report = remote.finish(report)         # rank 0: outputs, then report.json last (it names the bucket's URIs)
    remote.close()                         # the log so far, whatever ended the run

A checkpoint exists in the bucket once its manifest.json does (bucket/remote.py: every other file is uploaded
first): a run stopped mid-upload leaves a folder without one, which no resume reads and the next commit removes.
Only the checkpoint a resume continues from is downloaded at its start; the best one, which the final weights are
written from, is downloaded when the last step has been taken, if it is another one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from finetune.bucket.inputs import EPHEMERAL_ENV
from finetune.bucket.remote import Remote, commit_folder, committed, download_folder
from finetune.bucket.uri import check_location, is_remote, slug
from finetune.settings import caches
from finetune.settings.errors import UserError
from finetune.settings.wording import ref
from finetune.train.checkpoint import STEP_PREFIX, list_checkpoints, read_state, verify_checkpoint

log = logging.getLogger("finetune")
CHECKPOINTS = "checkpoints"
LOG_EVERY_S = 5.0  # metrics.jsonl reaches the bucket this often while a run trains (and at every checkpoint)
LOGS = ("plan.json", "metrics.jsonl", "skipped.jsonl")
PROBE = ".finetune-probe-"
INPUTS = ".inputs"  # a service job's data, downloaded into the run's copy (bucket/inputs.py): never uploaded


def staging_folder(uri: str, rank: int = 0) -> Path:
    """This node's copy of the run at `uri` (each rank but 0 has its own: it reads only the checkpoint)."""
    return caches.root() / "runs" / (slug(uri) + (f"-rank{rank}" if rank else ""))


def _step(name: str) -> int:
    return int(name[len(STEP_PREFIX) :])


def _is_step(name: str) -> bool:
    return name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX) :].isdigit()


class RemoteRun:
    def __init__(self, uri: str, rank: int = 0) -> None:
        check_location(uri, ref("out"))
        self.uri = uri.rstrip("/")
        self.remote = Remote(self.uri)
        self.local = staging_folder(self.uri, rank)
        self.main = rank == 0
        self.keep_last: int | None = None  # the plan's, once known (on_plan)
        self.total_steps: int | None = None
        self._pushed: set[str] = set()  # checkpoints committed in the bucket (by this run or before it)
        self._logged_at = 0.0

    # ------------------------------------------------------------------ before the run

    def open(self, resume: bool, run_files: Iterable[str]) -> Path:
        """Check the bucket, fetch what the run continues from; the staging folder, ready for the run."""
        self.remote.check_writable()  # before anything slow: a node without credentials says so here
        listing = self.remote.listing()
        taken = sorted({name.split("/")[0] for name in listing} & set(run_files))
        if taken and not resume:
            raise UserError(
                f"{self.uri} already holds a run ({', '.join(taken)}); pass {ref('resume')} to continue it, or "
                f"choose another {ref('out')}"
            )
        shutil.rmtree(self.local, ignore_errors=True)  # a copy of an earlier session: the bucket holds the run
        self.local.mkdir(parents=True)
        wanted = [n for n in listing if not n.startswith(f"{CHECKPOINTS}/") and not n.startswith(PROBE)]
        self.remote.get({name: self.local / name for name in wanted})
        self._pushed = {n for n in committed(self.remote.child(CHECKPOINTS)) if _is_step(n)}
        if resume:
            self._fetch_resume_point()
        return self.local

    def _fetch_resume_point(self) -> None:
        """The newest committed checkpoint that downloads whole and reads back; the damaged ones are said."""
        damaged = []
        for name in sorted(self._pushed, key=_step, reverse=True):
            folder = self.local / CHECKPOINTS / name
            problem = download_folder(self.remote.child(CHECKPOINTS, name), folder) or verify_checkpoint(folder)
            if problem is None:
                if damaged and self.main:
                    log.warning("%s: %s; resuming from %s", ref("resume"), "; ".join(damaged), name)
                return
            shutil.rmtree(folder, ignore_errors=True)
            damaged.append(f"{name} in {self.uri} is damaged: {problem}")
        if damaged and self.main:
            log.warning("%s: no usable checkpoint in %s (%s)", ref("resume"), self.uri, "; ".join(damaged))

    # ------------------------------------------------------------------ while it runs (rank 0)

    def chain(self, on_plan: Callable | None, on_step: Callable[[dict], None] | None) -> tuple[Callable, Callable]:
        """(on_plan, on_step) for the run: this mirror's, then the caller's."""

        def planned(plan) -> None:
            self.keep_last, self.total_steps = plan.run.keep_checkpoints, plan.total_steps
            if on_plan:
                on_plan(plan)

        def stepped(row: dict) -> None:
            self.after_step(row)
            if on_step:
                on_step(row)

        return planned, stepped

    def after_step(self, row: dict) -> None:
        """A new checkpoint (the loop saved one at this step: its timing is in the row) goes up; the log often."""
        if "checkpoint_s" in row:
            self.push_checkpoints()
            if row.get("step") == self.total_steps:
                self.fetch_best()
        if "checkpoint_s" in row or time.monotonic() - self._logged_at > LOG_EVERY_S:
            self.push_logs()

    def push_checkpoints(self) -> None:
        """Upload the local checkpoints the bucket lacks (every file, then the manifest), then remove from the bucket
        what this run keeps no more: never before the newer checkpoint's manifest is there."""
        local = [p.name for p in list_checkpoints(self.local)]
        for name in local:
            if name not in self._pushed:
                commit_folder(self.local / CHECKPOINTS / name, self.remote.child(CHECKPOINTS, name))
                self._pushed.add(name)
        keep = self._keep(local)
        folders = {name.split("/")[1] for name in self.remote.listing(CHECKPOINTS) if name.count("/") >= 2}
        for name in sorted(folders - keep):  # pruned ones, and uploads that never finished (no manifest)
            self.remote.remove(f"{CHECKPOINTS}/{name}")
            self._pushed.discard(name)

    def _keep(self, local: list[str]) -> set[str]:
        """What the bucket keeps: the last `keep_checkpoints` of its own and this node's, and the best one."""
        steps = sorted({n for n in (*local, *self._pushed) if _is_step(n)}, key=_step)
        keep = set(steps[-self.keep_last :]) if self.keep_last else set(steps)
        best = self._best_step(local)
        if best is not None:
            keep.add(f"{STEP_PREFIX}{best:06d}")
        return keep | set(local)

    def _best_step(self, local: list[str]) -> int | None:
        if not local:
            return None
        try:
            return read_state(self.local / CHECKPOINTS / local[-1]).best_step
        except (OSError, ValueError, TypeError):
            return None

    def fetch_best(self) -> None:
        """The best checkpoint, which the final weights are written from, when this node does not have it."""
        best = self._best_step([p.name for p in list_checkpoints(self.local)])
        name = f"{STEP_PREFIX}{best:06d}" if best is not None else None
        if name and not (self.local / CHECKPOINTS / name).is_dir() and name in self._pushed:
            problem = download_folder(self.remote.child(CHECKPOINTS, name), self.local / CHECKPOINTS / name)
            if problem:
                raise UserError(f"the best checkpoint {name} in {self.uri} is damaged: {problem}")

    def push_logs(self) -> None:
        self._logged_at = time.monotonic()
        self.remote.put({self.local / n: n for n in LOGS if (self.local / n).is_file()})

    # ------------------------------------------------------------------ after it

    def finish(self, report: dict) -> dict:
        """Upload the run's outputs, report.json last (with the bucket's URIs in it); the report as uploaded."""
        uploaded = {**report, "out_dir": self.uri}
        if report.get("final_weights"):
            uploaded["final_weights"] = f"{self.uri}/{Path(report['final_weights']).name}"
        files = {
            p: p.relative_to(self.local).as_posix()
            for p in sorted(self.local.rglob("*"))
            if p.is_file() and p.relative_to(self.local).parts[0] not in (CHECKPOINTS, "report.json", INPUTS)
        }
        self.remote.put(files)
        self.remote.write_bytes("report.json", json.dumps(uploaded, indent=2).encode())
        return uploaded

    def close(self) -> None:
        """Whatever ended the run (a stop, an error): the log so far reaches the bucket (rank 0). A service job's
        trainer ($FINETUNE_EPHEMERAL) then removes this node's copy: the bucket holds all a resume needs."""
        try:
            if self.main:
                self.push_logs()
        except UserError as exc:  # the bucket is what failed: say it, the run's own error follows
            log.warning("%s", exc)
        if os.environ.get(EPHEMERAL_ENV):
            shutil.rmtree(self.local, ignore_errors=True)


def open_remote_run(out: str | None, resume: bool, rank: int, run_files: Iterable[str]) -> RemoteRun | None:
    """The RemoteRun of an OUT that is a bucket URI, opened; None for a local folder."""
    check_location(out, ref("out"))  # s3:/one-slash and other schemes: refused, never made a local folder
    if not is_remote(out):
        return None
    remote = RemoteRun(out, rank)
    remote.open(resume, run_files)
    if remote.main:
        log.info("the run goes to %s (this node writes its copy in %s first)", remote.uri, remote.local)
    return remote


def run_copy(uri: str, checkpoint: int | None = None) -> Path:
    """A finished (or stopped) run in a bucket, as a folder on this node to read: its files but its checkpoints, and
    the one checkpoint `checkpoint` names (verified against its manifest). `finetune export`, `eval` and `chat` read it."""
    remote = Remote(uri.rstrip("/"))
    local = caches.root() / "runs" / f"{slug(uri)}-read"
    shutil.rmtree(local, ignore_errors=True)
    listing = remote.listing()
    if not listing:
        raise UserError(f"{uri} holds no run (nothing is stored under it)")
    wanted = [n for n in listing if not n.startswith(f"{CHECKPOINTS}/") and not n.startswith(PROBE)]
    remote.get({name: local / name for name in wanted})
    if checkpoint is not None:
        name = f"{STEP_PREFIX}{checkpoint:06d}"
        problem = download_folder(remote.child(CHECKPOINTS, name), local / CHECKPOINTS / name)
        if problem:
            raise UserError(f"checkpoint {name} of {uri} cannot be used: {problem}")
    return local
