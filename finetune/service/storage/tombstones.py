"""The database side of deleting (deletion.py, tenant_purge.py): which jobs still need a file, a deleted job's tombstone,
and a tenant's rows. Kept out of store.py, which holds the everyday queries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, or_, select, update

from finetune.service.api_error import APIError
from finetune.service.storage.db import (
    JOB_FILE_COLUMNS,
    api_keys,
    checkpoints,
    evaluations,
    events,
    files,
    idempotency_keys,
    jobs,
    transaction,
)
from finetune.service.storage.evaluations import not_ended
from finetune.service.storage.quotas import lock_tenant
from finetune.service.storage.store import TERMINAL, now


def _rows(result) -> list[dict]:
    return [dict(r._mapping) for r in result]


def _names(file_id):
    """A job names the file: as its training or validation file, or as its general conversations."""
    return or_(*(jobs.c[column] == file_id for column in JOB_FILE_COLUMNS))


def _using(tenant: str, file_id: str):
    return select(jobs).where(jobs.c.tenant == tenant, _names(file_id))


def jobs_using_file(engine: Engine, tenant: str, file_id: str) -> list[dict]:
    """The tenant's jobs that read the file (train, validate or replay on it), ended or not (oldest first)."""
    with transaction(engine) as conn:
        return _rows(conn.execute(_using(tenant, file_id).order_by(jobs.c.row)))


def delete_file_row_unless_needed(engine: Engine, tenant: str, file_id: str) -> list[dict]:
    """Delete the file's row, in one write transaction with the check that no job still needs it (one that has not
    ended, that a worker still holds while it stops, or that is being evaluated: its evaluation reads the test split
    and writes answers); those jobs (nothing deleted), or [] (deleted). Under the tenant's lock, as a new job's look
    at its files (files_still_there): of a job created and its file deleted at once, one is refused."""
    evaluating = select(evaluations.c.id).where(
        evaluations.c.job_id == jobs.c.id, evaluations.c.status.in_(("queued", "running"))
    )
    with transaction(engine, write=True) as conn:
        lock_tenant(conn, tenant)
        query = _using(tenant, file_id).where(
            or_(jobs.c.status.not_in(TERMINAL), jobs.c.claim_token.is_not(None), evaluating.exists())
        )
        needing = _rows(conn.execute(query.order_by(jobs.c.row)))
        for job in needing:
            if job["status"] in TERMINAL and job["claim_token"] is None:
                job["status"] += ", being evaluated"
        if not needing:
            conn.execute(delete(files).where(files.c.tenant == tenant, files.c.id == file_id))
            conn.execute(
                delete(idempotency_keys).where(
                    idempotency_keys.c.tenant == tenant, idempotency_keys.c.object_id == file_id
                )
            )
        return needing


def files_still_there(tenant: str, named: list[tuple[str, APIError]]) -> Callable[[Connection, dict], None]:
    """For store.create_job, inside the write that adds the job: each file it names (an id, and the refusal to raise
    when it is gone) still there, looked at under the tenant's lock that deleting a file takes too (SQLite: the write
    lock), so that a file deleted since the request's own look at it refuses the job, never a job left to fail later."""

    def admit(conn: Connection, row: dict) -> None:
        lock_tenant(conn, tenant)
        for file_id, refusal in named:
            if conn.execute(select(files.c.id).where(files.c.tenant == tenant, files.c.id == file_id)).first() is None:
                raise refusal

    return admit


def tombstone_job(engine: Engine, tenant: str, job_id: str, removed: list[dict[str, Any]]) -> dict | None:
    """Mark an ended job deleted (its row stays: when, and what was removed), its fine-tuned model with it, and
    delete its events, checkpoint rows, evaluation rows, results files' rows and Idempotency-Key answers. The row
    keeps what the docs promise (status, hyperparameters, usage): the run's report goes, and its error keeps its code
    and param, not its message (which may quote the data). Returns the row as it was before, or None when the tenant
    has no such ended job."""
    with transaction(engine, write=True) as conn:
        query = select(jobs).where(jobs.c.tenant == tenant, jobs.c.id == job_id, jobs.c.status.in_(TERMINAL))
        job = conn.execute(query.with_for_update()).first()
        if job is None:
            return None
        job = dict(job._mapping)
        gone = {
            "events": conn.execute(delete(events).where(events.c.job_id == job_id)).rowcount,
            "checkpoint records": conn.execute(delete(checkpoints).where(checkpoints.c.job_id == job_id)).rowcount,
            "evaluation records": conn.execute(delete(evaluations).where(evaluations.c.job_id == job_id)).rowcount,
        }
        stamp = now()
        removed = removed + [{"what": what, "count": count} for what, count in gone.items() if count]
        values: dict[str, Any] = {"deleted_at": stamp, "removed": removed, "report": None}
        values["error"] = _kept_error(job["error"])
        if job["fine_tuned_model"] and job["model_deleted_at"] is None:
            values["model_deleted_at"] = stamp
        conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
        results = list(job["result_files"] or [])
        if results:
            conn.execute(delete(files).where(files.c.tenant == tenant, files.c.id.in_(results)))
        conn.execute(
            delete(idempotency_keys).where(idempotency_keys.c.tenant == tenant, idempotency_keys.c.object_id == job_id)
        )
        return job


def _kept_error(error: dict | None) -> dict | None:
    """What a tombstone keeps of a failed job's error: its code and param, not its message, which may quote the data
    (an unknown role, a line's text)."""
    if not error:
        return error
    code = error.get("code")
    return {"code": code, "param": error.get("param"),
            "message": f"The job failed ({code}); its message went with its data when the job was deleted."}  # fmt: skip


class ModelInUse(Exception):
    """An evaluation not ended reads the model's weights (its command loads them)."""

    def __init__(self, evaluation: dict) -> None:
        super().__init__(evaluation["id"])
        self.evaluation = evaluation


def delete_fine_tuned_model(engine: Engine, tenant: str, name: str) -> dict | None:
    """Mark the tenant's fine-tuned model `name` deleted and delete its checkpoints' rows (each is a model too), in
    one write transaction with the check that no evaluation not ended reads it; its job (None: no such model of the
    tenant's). ModelInUse (nothing changed) while one does. The job's row is locked as an evaluation's creation locks
    it (evaluations.py), so of the two at once one sees the other."""
    with transaction(engine, write=True) as conn:
        query = select(jobs).where(
            jobs.c.tenant == tenant,
            jobs.c.status == "succeeded",
            jobs.c.fine_tuned_model == name,
            jobs.c.model_deleted_at.is_(None),
        )
        job = conn.execute(query.with_for_update()).first()
        if job is None:
            return None
        job = dict(job._mapping)
        evaluation = conn.execute(not_ended(job["id"])).first()
        if evaluation is not None:
            raise ModelInUse(dict(evaluation._mapping))
        conn.execute(update(jobs).where(jobs.c.id == job["id"]).values(model_deleted_at=now()))
        conn.execute(delete(checkpoints).where(checkpoints.c.job_id == job["id"]))
        return job


# ---------------------------------------------------------------------------------------------- a whole tenant


def tenant_files(engine: Engine, tenant: str) -> list[dict]:
    with transaction(engine) as conn:
        return _rows(conn.execute(select(files).where(files.c.tenant == tenant).order_by(files.c.row)))


def tenant_jobs(engine: Engine, tenant: str) -> list[dict]:
    with transaction(engine) as conn:
        return _rows(conn.execute(select(jobs).where(jobs.c.tenant == tenant).order_by(jobs.c.row)))


def tenant_keys(engine: Engine, tenant: str) -> list[dict]:
    """The tenant's keys not revoked yet (id and created_at; never a hash)."""
    query = select(api_keys.c.id, api_keys.c.created_at).where(
        api_keys.c.tenant == tenant, api_keys.c.revoked_at.is_(None)
    )
    with transaction(engine) as conn:
        return _rows(conn.execute(query.order_by(api_keys.c.created_at)))


def revoke_tenant_keys(engine: Engine, tenant: str) -> int:
    with transaction(engine, write=True) as conn:
        done = conn.execute(
            update(api_keys)
            .where(api_keys.c.tenant == tenant, api_keys.c.revoked_at.is_(None))
            .values(revoked_at=now())
        )
        return done.rowcount


def delete_tenant_rows(engine: Engine, tenant: str) -> dict[str, int]:
    """Every row of the tenant's files and jobs (their events, checkpoints and evaluations) and Idempotency-Key answers; the
    counts deleted. Its keys stay, revoked (their ids are what an audit trail names)."""
    with transaction(engine, write=True) as conn:
        owned = select(jobs.c.id).where(jobs.c.tenant == tenant)
        counts = {
            "events": conn.execute(delete(events).where(events.c.job_id.in_(owned))).rowcount,
            "checkpoints": conn.execute(delete(checkpoints).where(checkpoints.c.job_id.in_(owned))).rowcount,
            "evaluations": conn.execute(delete(evaluations).where(evaluations.c.job_id.in_(owned))).rowcount,
        }
        counts["jobs"] = conn.execute(delete(jobs).where(jobs.c.tenant == tenant)).rowcount
        counts["files"] = conn.execute(delete(files).where(files.c.tenant == tenant)).rowcount
        counts["idempotency answers"] = conn.execute(
            delete(idempotency_keys).where(idempotency_keys.c.tenant == tenant)
        ).rowcount
        return counts


def held_jobs(engine: Engine, tenant: str) -> list[dict]:
    """The tenant's jobs a worker still holds (its trainer may still write into the run folder), and its evaluations
    a worker runs (they write into a run folder too)."""
    query = select(jobs.c.id, jobs.c.status, jobs.c.worker).where(
        jobs.c.tenant == tenant, jobs.c.claim_token.is_not(None)
    )
    running = select(evaluations.c.id, evaluations.c.status, evaluations.c.worker).where(
        evaluations.c.tenant == tenant, evaluations.c.claim_token.is_not(None)
    )
    with transaction(engine) as conn:
        return _rows(conn.execute(query.order_by(jobs.c.row))) + _rows(conn.execute(running))


def fail_waiting_evaluations(engine: Engine, tenant: str, why: str) -> int:
    """The tenant's evaluations no worker has taken yet end as failed (a purge: none may start meanwhile)."""
    error = {"code": "cancelled", "message": why, "param": None}
    with transaction(engine, write=True) as conn:
        done = conn.execute(
            update(evaluations)
            .where(
                evaluations.c.tenant == tenant, evaluations.c.status == "queued", evaluations.c.claim_token.is_(None)
            )
            .values(status="failed", finished_at=now(), error=error)
        )
        return done.rowcount


# ---------------------------------------------------------------------------------------------- retention


def expired_jobs(engine: Engine, cutoff: int) -> list[dict]:
    """Ended jobs, not deleted yet and let go by their workers, that ended (or were created) before `cutoff`."""
    ended = func.coalesce(jobs.c.finished_at, jobs.c.created_at)
    query = select(jobs).where(
        jobs.c.status.in_(TERMINAL), jobs.c.deleted_at.is_(None), jobs.c.claim_token.is_(None), ended < cutoff
    )
    with transaction(engine) as conn:
        return _rows(conn.execute(query.order_by(jobs.c.row)))


def expired_files(engine: Engine, cutoff: int, results_purpose: str) -> list[dict]:
    """Files uploaded before `cutoff` that no job which has not ended uses (a job's results file goes with its job)."""
    busy = select(jobs.c.id).where(jobs.c.status.not_in(TERMINAL), _names(files.c.id))
    query = select(files).where(files.c.created_at < cutoff, files.c.purpose != results_purpose, ~busy.exists())
    with transaction(engine) as conn:
        return _rows(conn.execute(query.order_by(files.c.row)))
