"""The one data-access layer. Every query a tenant can reach takes the tenant and filters on it, so another
tenant's ids simply are not found (404). The workers' calls are not tenant-scoped but carry the claim
token: a write from a worker whose lease went to another worker matches no row and raises LeaseLost.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, and_, delete, func, insert, or_, select, true, update

from finetune.service.storage import keys as keyring
from finetune.service.storage.db import (
    api_keys,
    checkpoints,
    events,
    files,
    jobs,
    make_engine,
    migrate,
    transaction,
)
from finetune.service.storage.idempotency_keys import IdempotencyKeys
from finetune.service.storage.quotas import tenants_at_running_quota
from finetune.service.storage.worker_registry import WorkerRegistry

MAX_ROW_NUMBER = 2**63 - 1  # SQL's BIGINT: a cursor past it names no row
TERMINAL = ("succeeded", "failed", "cancelled")
CLAIMABLE = ("validating_files", "queued")
# The job's state machine, in one table: every write of a status goes through it, the caller's actions
# (cancel, pause, resume) and the worker's events alike.
#   name -> (the statuses it is legal from, the status it leads to; None = the status stays)
# A job is created `queued` (waiting for a worker); the worker that claims it moves it to `validating_files`.
# The worker's writes are skipped (not errors) when the job has left those statuses meanwhile (a cancel or pause).
TRANSITIONS: dict[str, tuple[tuple[str, ...], str | None]] = {
    # the caller's actions
    "cancel": (("validating_files", "queued", "running", "paused"), "cancelled"),
    "pause": (("validating_files", "queued", "running"), "paused"),
    "resume": (("paused",), "queued"),
    # the worker's events
    "claim": (("queued",), "validating_files"),  # a job not validated yet (a planned one stays queued)
    "validated": (("validating_files", "queued"), "queued"),
    "planned": (("queued", "running"), None),
    "start": (("queued", "running"), "running"),
    "died": (("running",), "running"),  # its trainer died; it resumes from its last checkpoint
    "progress": (("running",), None),  # metrics rows as events: after a cancel or pause those stay the last word
    "requeue": (("running",), "queued"),  # its worker stops, or its trainer died: the next worker resumes it
    "succeed": (("running",), "succeeded"),
    "fail": (("validating_files", "queued", "running"), "failed"),
}
CREATED = "queued"
ACTIONS = ("cancel", "pause", "resume")  # what a caller may do (the rest are the worker's)


class IllegalTransition(Exception):
    def __init__(self, action: str, status: str) -> None:
        super().__init__(f"cannot {action} a job that is {status}")
        self.status = status


class LeaseLost(Exception):
    """This worker's claim on a job is gone (its lease expired and another worker took the job)."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_urlsafe(18).replace('-', 'x').replace('_', 'y')}"


def now() -> int:
    return int(time.time())


@dataclass
class Page:
    rows: list[dict]
    has_more: bool


@dataclass
class Claim:
    job: dict
    token: str
    was_running: bool  # the previous holder died mid-run (its lease expired)


def _rows(result) -> list[dict]:
    return [dict(r._mapping) for r in result]


def _one(result) -> dict | None:
    row = result.first()
    return dict(row._mapping) if row is not None else None


class Store:
    def __init__(self, url: str, engine: Engine | None = None) -> None:
        self.engine = engine or make_engine(url)
        self.workers = WorkerRegistry(self.engine)  # who is alive, on what device (worker_registry.py)
        self.idempotency = IdempotencyKeys(self.engine)  # Idempotency-Key answers (idempotency_keys.py)

    def migrate(self) -> int:
        return migrate(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def _read(self):
        return transaction(self.engine, write=False)

    def _write(self):
        return transaction(self.engine, write=True)

    # ------------------------------------------------------------------ keys

    def create_key(self, tenant: str) -> tuple[str, str]:
        """(key id, the key): the key is returned once and never stored."""
        key_id, key, hashed = keyring.new_key()
        with self._write() as conn:
            conn.execute(insert(api_keys).values(id=key_id, tenant=tenant, hash=hashed, created_at=now()))
        return key_id, key

    def ensure_default_key(self) -> str | None:
        """On a first start (no key at all), a key for tenant `default`; None when keys exist."""
        with self._write() as conn:
            if conn.execute(select(func.count()).select_from(api_keys)).scalar():
                return None
            key_id, key, hashed = keyring.new_key()
            conn.execute(insert(api_keys).values(id=key_id, tenant="default", hash=hashed, created_at=now()))
        return key

    def list_keys(self) -> list[dict]:
        with self._read() as conn:
            return _rows(
                conn.execute(
                    select(api_keys.c.id, api_keys.c.tenant, api_keys.c.created_at, api_keys.c.revoked_at).order_by(
                        api_keys.c.created_at, api_keys.c.id
                    )
                )
            )

    def revoke_key(self, key_id: str) -> bool:
        with self._write() as conn:
            done = conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=now())
            )
            return done.rowcount == 1

    def tenant_for_key(self, key: str) -> str | None:
        key_id = keyring.key_id_of(key)
        row = None
        if key_id is not None:
            with self._read() as conn:
                row = _one(
                    conn.execute(select(api_keys).where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None)))
                )
        if not keyring.matches(key, row["hash"] if row else None):
            return None
        return row["tenant"] if row else None

    # ------------------------------------------------------------------ files

    def add_file(self, tenant: str, file_id: str, filename: str, purpose: str, size: int, admit=None) -> dict:
        """`admit(conn, row)`: a check after the insert, in its transaction (quotas.admit_file); raising undoes it."""
        values = dict(id=file_id, tenant=tenant, filename=filename, purpose=purpose, bytes=size, created_at=now())
        with self._write() as conn:
            conn.execute(insert(files).values(**values))
            admit and admit(conn, values)
        return values

    def get_file(self, tenant: str, file_id: str) -> dict | None:
        with self._read() as conn:
            return _one(conn.execute(select(files).where(files.c.tenant == tenant, files.c.id == file_id)))

    def list_files(
        self, tenant: str, after: str | None, limit: int, order: str = "desc", purpose: str | None = None
    ) -> Page:
        query = select(files).where(files.c.tenant == tenant)
        if purpose:
            query = query.where(files.c.purpose == purpose)
        return self._page(files, query, tenant, after, limit, ascending=order == "asc")

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self._write() as conn:
            return conn.execute(delete(files).where(files.c.tenant == tenant, files.c.id == file_id)).rowcount == 1

    # ------------------------------------------------------------------ paging

    def _page(self, table, query, tenant: str, after: str | None, limit: int, ascending: bool = False) -> Page:
        """Newest first (or oldest first); `after` = the id of the last item of the previous page."""
        with self._read() as conn:
            if after is not None:
                anchor = conn.execute(select(table.c.row).where(table.c.tenant == tenant, table.c.id == after)).scalar()
                if anchor is None:
                    return Page([], False)  # an unknown cursor: an empty page, as the SDK expects
                query = query.where(table.c.row > anchor if ascending else table.c.row < anchor)
            query = query.order_by(table.c.row.asc() if ascending else table.c.row.desc()).limit(limit + 1)
            rows = _rows(conn.execute(query))
        return Page(rows[:limit], len(rows) > limit)

    # ------------------------------------------------------------------ jobs (tenant side)

    def create_job(self, tenant: str, values: dict[str, Any], admit=None) -> dict:
        job_id = new_id("ftjob")
        row = dict(values, id=job_id, tenant=tenant, status=CREATED, created_at=now(), attempts=0)
        row.setdefault("events_step", 0)
        row.setdefault("deaths_at_step", 0)
        row.setdefault("devices", int((row.get("run_settings") or {}).get("devices", 1)))
        with self._write() as conn:
            conn.execute(insert(jobs).values(**row))
            admit and admit(conn, row)  # quotas.admit_job: raising undoes the insert
            self._event(conn, job_id, f"Created fine-tuning job: {job_id}")
            return _one(conn.execute(select(jobs).where(jobs.c.id == job_id)))

    def get_job(self, tenant: str, job_id: str) -> dict | None:
        with self._read() as conn:
            return _one(conn.execute(select(jobs).where(jobs.c.tenant == tenant, jobs.c.id == job_id)))

    def list_jobs(self, tenant: str, after: str | None, limit: int, metadata: dict[str, str] | None = None) -> Page:
        if not metadata:
            return self._page(jobs, select(jobs).where(jobs.c.tenant == tenant), tenant, after, limit)
        # metadata is a JSON column: filter in Python over the tenant's jobs (a tenant has few thousand at most)
        page = self._page(jobs, select(jobs).where(jobs.c.tenant == tenant), tenant, after, 1_000_000)
        chosen = [r for r in page.rows if all((r["metadata"] or {}).get(k) == v for k, v in metadata.items())]
        return Page(chosen[:limit], len(chosen) > limit)

    def transition(self, tenant: str, job_id: str, action: str) -> dict | None:
        """cancel / pause / resume; None when the job is not the tenant's. The worker holding the job sees the
        new status at its next heartbeat and stops the trainer (which checkpoints first)."""
        allowed, target = TRANSITIONS[action]
        with self._write() as conn:
            job = _one(conn.execute(select(jobs).where(jobs.c.tenant == tenant, jobs.c.id == job_id).with_for_update()))
            if job is None:
                return None
            if job["status"] not in allowed or action not in ACTIONS:
                raise IllegalTransition(action, job["status"])
            values: dict[str, Any] = {"status": target}
            if target == "cancelled":
                values["finished_at"] = now()
                self._event(conn, job_id, "Fine-tuning job cancelled")
            elif target == "paused":
                self._event(conn, job_id, "Fine-tuning job paused")
            else:
                self._event(conn, job_id, "Fine-tuning job resumed")
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))
            return _one(conn.execute(select(jobs).where(jobs.c.id == job_id)))

    def _owned(self, conn, tenant: str, job_id: str) -> bool:
        return conn.execute(select(jobs.c.id).where(jobs.c.tenant == tenant, jobs.c.id == job_id)).first() is not None

    def list_events(self, tenant: str, job_id: str, after: str | None, limit: int) -> Page | None:
        query = select(events).where(events.c.job_id == job_id)
        with self._read() as conn:
            if not self._owned(conn, tenant, job_id):
                return None
            if after is not None:
                anchor = _event_row(after)
                known = select(events.c.row).where(events.c.job_id == job_id, events.c.row == anchor)
                if anchor is None or conn.execute(known).first() is None:
                    return Page([], False)  # an unknown cursor (or another job's event): an empty page
                query = query.where(events.c.row < anchor)
            rows = _rows(conn.execute(query.order_by(events.c.row.desc()).limit(limit + 1)))
        return Page(rows[:limit], len(rows) > limit)

    def list_checkpoints(self, tenant: str, job_id: str, after: str | None, limit: int) -> Page | None:
        query = select(checkpoints).where(checkpoints.c.job_id == job_id)
        with self._read() as conn:
            if not self._owned(conn, tenant, job_id):
                return None
            if after is not None:
                anchor = conn.execute(
                    select(checkpoints.c.step).where(checkpoints.c.job_id == job_id, checkpoints.c.id == after)
                ).scalar()
                if anchor is None:
                    return Page([], False)
                query = query.where(checkpoints.c.step < anchor)
            rows = _rows(conn.execute(query.order_by(checkpoints.c.step.desc()).limit(limit + 1)))
        return Page(rows[:limit], len(rows) > limit)

    def succeeded_jobs(self, tenant: str) -> list[dict]:
        """The tenant's jobs whose fine-tuned model exists (succeeded, and the model not deleted since)."""
        with self._read() as conn:
            return _rows(
                conn.execute(
                    select(jobs)
                    .where(
                        jobs.c.tenant == tenant,
                        jobs.c.status == "succeeded",
                        jobs.c.fine_tuned_model.is_not(None),
                        jobs.c.model_deleted_at.is_(None),
                    )
                    .order_by(jobs.c.row)
                )
            )

    def all_jobs(self, tenant: str) -> list[dict]:
        with self._read() as conn:
            return _rows(conn.execute(select(jobs).where(jobs.c.tenant == tenant).order_by(jobs.c.row)))

    # ------------------------------------------------------------------ events

    @staticmethod
    def _event(conn, job_id: str, message: str, level: str = "info", kind: str = "message", data=None) -> None:
        conn.execute(
            insert(events).values(job_id=job_id, created_at=now(), level=level, type=kind, message=message, data=data)
        )

    # ------------------------------------------------------------------ workers

    def claim(self, worker: str, lease_seconds: float, max_devices: int | None = None) -> Claim | None:
        """Take the oldest job waiting (or one whose worker's lease ran out) that needs at most `max_devices`
        devices (None: any). PostgreSQL: FOR UPDATE SKIP LOCKED, so workers never wait on each other's candidate;
        SQLite: the whole claim holds the write lock. A job no worker can run (or its tenant at its running quota:
        quotas.py) stays queued."""
        t = time.time()
        free = or_(jobs.c.claim_token.is_(None), jobs.c.lease_expires_at < t)
        waiting = and_(jobs.c.status.in_(CLAIMABLE), free)
        orphaned = and_(jobs.c.status == "running", jobs.c.lease_expires_at < t)
        fits = jobs.c.devices <= max_devices if max_devices is not None else true()
        with self._write() as conn:
            busy = jobs.c.tenant.not_in(tenants_at_running_quota(conn, t))  # their jobs wait (quotas.py)
            job = _one(
                conn.execute(
                    select(jobs)
                    .where(or_(waiting, orphaned), fits, busy)
                    .order_by(jobs.c.row)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                )
            )
            if job is None:
                return None
            token = uuid.uuid4().hex
            was_running = job["status"] == "running"
            values = {"claim_token": token, "worker": worker, "lease_expires_at": t + lease_seconds}
            if job["resolved"] is None and job["status"] in TRANSITIONS["claim"][0]:
                values["status"] = TRANSITIONS["claim"][1]  # not validated yet: the worker validates it now
            conn.execute(update(jobs).where(jobs.c.id == job["id"]).values(**values))
        job.update(values)
        return Claim(job, token, was_running=was_running)

    def heartbeat(self, job_id: str, token: str, lease_seconds: float) -> str:
        """Renew the lease; returns the job's status (cancel/pause show up here)."""
        with self._write() as conn:
            done = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.claim_token == token)
                .values(lease_expires_at=time.time() + lease_seconds)
            )
            if done.rowcount != 1:
                raise LeaseLost(job_id)
            return conn.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar()

    def worker_update(
        self,
        job_id: str,
        token: str,
        event: str | None = None,
        values: dict[str, Any] | None = None,
        new_events: list[dict] | None = None,
        lease_seconds: float | None = None,
    ) -> bool:
        """Apply a worker's write atomically: the status `event` leads to (TRANSITIONS), values, events. Refused
        (LeaseLost) without the current token; skipped (False) when the job's status is not one `event` is legal
        from (it was cancelled or paused meanwhile). Without an event, the status is left alone and never checked."""
        values = dict(values or {})
        if "status" in values:
            raise ValueError("a worker changes a job's status through an event of TRANSITIONS, not a value")
        with self._write() as conn:
            job = _one(
                conn.execute(
                    select(jobs.c.status).where(jobs.c.id == job_id, jobs.c.claim_token == token).with_for_update()
                )
            )
            if job is None:
                raise LeaseLost(job_id)
            if event is not None:
                allowed, target = TRANSITIONS[event]
                if job["status"] not in allowed:
                    return False
                if target is not None:
                    values["status"] = target
            # any write of the holder also renews its lease
            lease = {"lease_expires_at": time.time() + lease_seconds} if lease_seconds else {}
            if values or lease:
                conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values, **lease))
            for e in new_events or []:
                self._event(conn, job_id, e["message"], e.get("level", "info"), e.get("type", "message"), e.get("data"))
            return True

    def sync_checkpoints(self, job_id: str, token: str, found: dict[int, dict], fine_tuned_base: str) -> None:
        """Make the job's checkpoint rows the checkpoints kept on disk (the trainer prunes old ones)."""
        with self._write() as conn:
            if conn.execute(select(jobs.c.id).where(jobs.c.id == job_id, jobs.c.claim_token == token)).first() is None:
                raise LeaseLost(job_id)
            have = set(conn.execute(select(checkpoints.c.step).where(checkpoints.c.job_id == job_id)).scalars())
            gone = have - set(found)
            if gone:
                conn.execute(delete(checkpoints).where(checkpoints.c.job_id == job_id, checkpoints.c.step.in_(gone)))
            for step in sorted(set(found) - have):
                conn.execute(
                    insert(checkpoints).values(
                        id=new_id("ftckpt"), job_id=job_id, step=step, created_at=now(), metrics=found[step]
                    )
                )

    def release(self, job_id: str, token: str, values: dict[str, Any] | None = None) -> None:
        """Give the job back (done, stopped, or to be resumed by whoever claims it next)."""
        with self._write() as conn:
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.claim_token == token)
                .values(claim_token=None, worker=None, lease_expires_at=None, **(values or {}))
            )

    def get_job_any(self, job_id: str) -> dict | None:
        """For the worker and the operator, not for API callers."""
        with self._read() as conn:
            return _one(conn.execute(select(jobs).where(jobs.c.id == job_id)))


def _event_row(event_id: str) -> int | None:
    return cursor_number(event_id, "ftevent-")


def cursor_number(cursor: str, prefix: str) -> int | None:
    """The number in a list's cursor (`ftevent-12`, `audit-7`), or None when it holds none a row can have (not
    digits, or past a BIGINT): an unknown cursor, which a list answers with an empty page."""
    digits = cursor[len(prefix) :] if cursor.startswith(prefix) else ""
    if not (digits.isascii() and digits.isdigit()) or len(digits.lstrip("0")) > len(str(MAX_ROW_NUMBER)):
        return None  # (a long run of digits is not even read: Python refuses to read past 4,300 of them)
    number = int(digits)
    return number if number <= MAX_ROW_NUMBER else None
