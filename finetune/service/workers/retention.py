"""`--retain-days N` (serve and worker): ended jobs' data and unused files older than N days are deleted, as
DELETE would delete them (deletion.py), by each worker on a thread of its own, at its start and every hour.

    a job:   ended (succeeded, failed, cancelled) more than N days ago -> its data and artifacts go, a tombstone stays
    a file:  uploaded more than N days ago and used by no job that has not ended -> it and its copies go

Several workers sweeping at once is harmless: each deletion checks again and removing what is gone is a no-op.
"""

from __future__ import annotations

import sys
import threading
import time

from finetune.service.options import ServiceOptions
from finetune.service.storage import deletion
from finetune.service.storage.store import Store
from finetune.service.storage.tombstones import expired_files, expired_jobs

SWEEP_EVERY_S = 3600.0
RESULTS_PURPOSE = "fine-tune-results"  # a job's results file: it goes with its job


def sweep(options: ServiceOptions, store: Store, now: float | None = None) -> list[str]:
    """Delete what is older than the retention period; the ids deleted (nothing without `retain_days`)."""
    if options.retain_days is None:
        return []
    cutoff = int((now if now is not None else time.time()) - options.retain_days * 86400)
    done = []
    for job in expired_jobs(store.engine, cutoff):
        try:
            if deletion.delete_job(options, store, job["tenant"], job["id"]) is not None:
                done.append(job["id"])
        except deletion.JobNotDeletable:
            continue  # taken up again meanwhile
    for row in expired_files(store.engine, cutoff, RESULTS_PURPOSE):
        try:
            deletion.delete_file(options, store, row["tenant"], row["id"])
            done.append(row["id"])
        except deletion.FileInUse:
            continue  # a job started on it meanwhile
    return done


class RetentionSweeper(threading.Thread):
    """Sweeps at start and every SWEEP_EVERY_S until `stopping` is set (a worker's own event)."""

    def __init__(self, options: ServiceOptions, store: Store, stopping: threading.Event) -> None:
        super().__init__(name="retention", daemon=True)
        self.options, self.store, self.stopping = options, store, stopping

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                deleted = sweep(self.options, self.store)
                if deleted:
                    print(f"retention: deleted {len(deleted)} job(s)/file(s) older than "
                          f"{self.options.retain_days:g} days", file=sys.stderr)  # fmt: skip
            except Exception as exc:  # a database hiccup: the next sweep tries again
                print(f"retention sweep failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            self.stopping.wait(SWEEP_EVERY_S)
