"""Evaluations of succeeded jobs (db.evaluations): what `POST /v1/fine_tuning/jobs/{id}/evaluations` records and a
worker runs (`finetune eval RUN [--retention]`, workers/evaluation.py).

    found = Evaluations(store.engine)
    found.create(tenant, job_id, retention, test, estimate)     # the tenant's succeeded job, or an APIError
    found.get(tenant, eval_id) / .page(tenant, job_id, after, limit) / .latest(tenant, job_id)
    claim = found.claim(worker, lease_seconds)                  # a worker takes the oldest waiting one
    found.heartbeat(eval_id, token, lease_seconds)              # False: its lease went to another worker
    found.finish(eval_id, token, "succeeded", results=...)      # False: the claim is not this worker's any more

Statuses: queued -> running -> succeeded | failed. A worker claims one with a lease and a token, like a job
(store.py): a worker that dies mid-evaluation lets its lease run out and the next worker starts the command again,
at most MAX_ATTEMPTS times. A job has at most one evaluation not ended at a time (a second is refused, naming it),
so a tenant's waiting evaluations are bounded by its succeeded jobs; they do not count against job quotas.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, insert, or_, select, update

from finetune.service.api_error import APIError
from finetune.service.storage.db import evaluations, events, jobs, transaction
from finetune.service.storage.store import Page, new_id, now

NOT_ENDED = ("queued", "running")
MAX_ATTEMPTS = 3  # starts of the command before an evaluation whose workers keep dying is failed
PARAM = "fine_tuning_job_id"


def refusal(job: dict | None, job_id: str) -> APIError | None:
    """Why this job cannot be evaluated (as the API answers it), or None when it can."""
    if job is None:
        return APIError(404, f"No fine-tuning job found with id {job_id!r}.", "not_found", PARAM)
    if job["deleted_at"] is not None or job["model_deleted_at"] is not None:
        return APIError(400, f"Job {job_id} was deleted (or its fine-tuned model was): nothing is left to evaluate.",
                        "job_deleted", PARAM)  # fmt: skip
    if job["status"] != "succeeded":
        return APIError(400, f"Job {job_id} is {job['status']}: only a succeeded job's model can be evaluated.",
                        "job_not_succeeded", PARAM)  # fmt: skip
    return None


def not_ended(job_id: str):
    """The query of the job's evaluation that has not ended (at most one)."""
    return select(evaluations).where(evaluations.c.job_id == job_id, evaluations.c.status.in_(NOT_ENDED))


@dataclass
class EvaluationClaim:
    evaluation: dict
    job: dict
    token: str


def _one(result) -> dict | None:
    row = result.first()
    return dict(row._mapping) if row is not None else None


class Evaluations:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ------------------------------------------------------------------ the tenant's side

    def create(self, tenant: str, job_id: str, retention: bool, test: bool, estimate: dict | None) -> dict:
        """A queued evaluation of the tenant's job. APIError (nothing added) when the job is not the tenant's (404), has
        not succeeded or was deleted (`refusal`), or is being evaluated already (`evaluation_in_progress`): 400, never
        409, which the SDK retries. The checks and the insert are one write transaction."""
        with transaction(self.engine, write=True) as conn:  # the job's row locked, as deleting its model locks it
            job = _one(conn.execute(select(jobs).where(jobs.c.tenant == tenant, jobs.c.id == job_id).with_for_update()))
            refused = refusal(job, job_id)
            if refused is not None:
                raise refused
            busy = _one(conn.execute(not_ended(job_id)))
            if busy is not None:
                raise APIError(
                    400,
                    f"Job {job_id} is being evaluated already ({busy['id']}, {busy['status']}): wait for it to end "
                    f"(GET /v1/fine_tuning/jobs/{job_id}/evaluations/{busy['id']}).",
                    "evaluation_in_progress",
                    PARAM,
                )
            row = dict(
                id=new_id("fteval"), job_id=job_id, tenant=tenant, retention=retention, test=test, status="queued",
                estimate=estimate, created_at=now(), attempts=0,
            )  # fmt: skip
            conn.execute(insert(evaluations).values(**row))
            return _one(conn.execute(select(evaluations).where(evaluations.c.id == row["id"])))

    def get(self, tenant: str, eval_id: str, job_id: str | None = None) -> dict | None:
        query = select(evaluations).where(evaluations.c.tenant == tenant, evaluations.c.id == eval_id)
        if job_id is not None:
            query = query.where(evaluations.c.job_id == job_id)
        with transaction(self.engine) as conn:
            return _one(conn.execute(query))

    def page(self, tenant: str, job_id: str, after: str | None, limit: int) -> Page:
        """The job's evaluations, newest first; `after` = the last id of the previous page (unknown: empty page)."""
        query = select(evaluations).where(evaluations.c.tenant == tenant, evaluations.c.job_id == job_id)
        with transaction(self.engine) as conn:
            if after is not None:
                anchor = conn.execute(
                    select(evaluations.c.row).where(
                        evaluations.c.tenant == tenant, evaluations.c.job_id == job_id, evaluations.c.id == after
                    )
                ).scalar()
                if anchor is None:
                    return Page([], False)
                query = query.where(evaluations.c.row < anchor)
            found = [dict(r._mapping) for r in conn.execute(query.order_by(evaluations.c.row.desc()).limit(limit + 1))]
        return Page(found[:limit], len(found) > limit)

    def latest(self, tenant: str, job_id: str) -> dict | None:
        rows = self.page(tenant, job_id, None, 1).rows
        return rows[0] if rows else None

    def unfinished(self, job_id: str) -> dict | None:
        """The job's evaluation that has not ended, if any (deletion refuses while there is one)."""
        with transaction(self.engine) as conn:
            return _one(conn.execute(not_ended(job_id)))

    # ------------------------------------------------------------------ the workers' side

    def claim(self, worker: str, lease_seconds: float) -> EvaluationClaim | None:
        """The oldest waiting evaluation, or a running one whose worker's lease ran out, of a job not deleted;
        PostgreSQL: FOR UPDATE SKIP LOCKED; SQLite: under the write lock. One that has used MAX_ATTEMPTS starts
        is failed instead (its workers keep dying on it), and None is returned for this round."""
        t = time.time()
        free = or_(evaluations.c.claim_token.is_(None), evaluations.c.lease_expires_at < t)
        waiting = and_(evaluations.c.status == "queued", free)
        orphaned = and_(evaluations.c.status == "running", evaluations.c.lease_expires_at < t)
        alive = select(jobs.c.id).where(jobs.c.deleted_at.is_(None))
        with transaction(self.engine, write=True) as conn:
            found = _one(
                conn.execute(
                    select(evaluations)
                    .where(or_(waiting, orphaned), evaluations.c.job_id.in_(alive))
                    .order_by(evaluations.c.row)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                )
            )
            if found is None:
                return None
            if found["attempts"] >= MAX_ATTEMPTS:
                error = {"code": "evaluation_died", "message": f"its worker stopped {found['attempts']} times; not "
                         "retrying", "param": None}  # fmt: skip
                values: dict[str, Any] = {"status": "failed", "finished_at": now(), "error": error}
                conn.execute(update(evaluations).where(evaluations.c.id == found["id"]).values(**values, **_let_go()))
                return None
            token = uuid.uuid4().hex
            values = {"status": "running", "attempts": found["attempts"] + 1, "claim_token": token, "worker": worker,
                      "lease_expires_at": t + lease_seconds, "started_at": found["started_at"] or now()}  # fmt: skip
            conn.execute(update(evaluations).where(evaluations.c.id == found["id"]).values(**values))
            job = _one(conn.execute(select(jobs).where(jobs.c.id == found["job_id"])))
        return EvaluationClaim({**found, **values}, job or {}, token)

    def heartbeat(
        self, eval_id: str, token: str, lease_seconds: float, job_events: tuple[str, list[dict]] | None = None
    ) -> bool:
        """Renew the claim's lease; `job_events` (the job's id, events): the evaluation's progress lines, added to the
        job's events in the same write while the claim is this worker's."""
        with transaction(self.engine, write=True) as conn:
            done = conn.execute(
                update(evaluations)
                .where(evaluations.c.id == eval_id, evaluations.c.claim_token == token)
                .values(lease_expires_at=time.time() + lease_seconds)
            )
            if done.rowcount == 1 and job_events and job_events[1]:
                job_id, new = job_events
                conn.execute(insert(events), [
                    {"job_id": job_id, "created_at": now(), "level": "info", "type": "message",
                     "message": e["message"], "data": e.get("data")} for e in new
                ])  # fmt: skip
            return done.rowcount == 1

    def finish(
        self, eval_id: str, token: str, status: str, results: dict | None = None, error: dict | None = None
    ) -> bool:
        """The end of a claimed evaluation (succeeded or failed); False when the claim is no longer this worker's."""
        if status not in ("succeeded", "failed"):
            raise ValueError(f"an evaluation ends succeeded or failed, not {status}")
        values = {"status": status, "finished_at": now(), "results": results, "error": error, **_let_go()}
        with transaction(self.engine, write=True) as conn:
            done = conn.execute(
                update(evaluations)
                .where(evaluations.c.id == eval_id, evaluations.c.claim_token == token)
                .values(**values)
            )
            return done.rowcount == 1

    def keep_numbers_only(self, job_ids: list[str]) -> int:
        """Rewrite the results of these jobs' evaluations as `numbers_only` (deleting a file they trained on);
        how many changed."""
        changed = 0
        with transaction(self.engine, write=True) as conn:
            query = select(evaluations.c.id, evaluations.c.results).where(evaluations.c.job_id.in_(job_ids))
            for eval_id, results in conn.execute(query).all():
                if (kept := numbers_only(results)) != results:
                    conn.execute(update(evaluations).where(evaluations.c.id == eval_id).values(results=kept))
                    changed += 1
        return changed

    def requeue(self, eval_id: str, token: str) -> bool:
        """A stopping worker gives its evaluation back: the next worker runs it from the start."""
        with transaction(self.engine, write=True) as conn:
            done = conn.execute(
                update(evaluations)
                .where(evaluations.c.id == eval_id, evaluations.c.claim_token == token)
                .values(status="queued", **_let_go())
            )
            return done.rowcount == 1


def numbers_only(results: dict | None) -> dict | None:
    """An evaluation's results with nothing quoted from the team's data: results written before issue 47 kept the
    team's recurring lines (the retention check's team_voice `lines`: a sign-off holds a phone number) and the
    answers to the general requests (which may repeat them); now a count of the lines, and no answer."""
    retention = (results or {}).get("retention")
    if not isinstance(retention, dict):
        return results
    kept = {k: v for k, v in retention.items() if k != "requests"}
    voice = kept.get("team_voice")
    if isinstance(voice, dict) and isinstance(voice.get("lines"), list):
        kept["team_voice"] = voice | {"lines": len(voice["lines"])}
    return {**(results or {}), "retention": kept}


def _let_go() -> dict:
    return {"claim_token": None, "worker": None, "lease_expires_at": None}
