"""Quotas per tenant: what the operator set (`finetune serve tenants set`, the table tenant_quotas), what a tenant
uses against them, and the checks (docs/service.md, Quotas).

    running jobs    jobs a worker holds now (a live lease: validating, planning or training). Never refused: the claim
                    (store.claim) skips a tenant at its quota, so its jobs wait queued while other tenants' run.
    queued jobs     jobs waiting for a worker (queued or validating_files, held by none). A create past it: 429 and
                    a Retry-After (waiting helps: a job leaves the queue when a worker takes it).
    stored bytes    the tenant's files (uploads and the results files of its jobs). An upload past it: 403 (deleting
                    files helps, waiting does not).
    monthly tokens  billed tokens (usage.py) of the jobs created in this UTC calendar month: what succeeded jobs
                    trained, and what jobs not ended are expected to train (their plan's estimate; until planned,
                    their file's, held in job_token_holds). A create past it: 403 and a Retry-After (the month's end).

A tenant's own value of a quota wins, else the default row ("*"), else there is none. A lowered quota refuses new
requests only: nothing queued is dropped. The checks run inside the write that adds the job or the file (PostgreSQL:
under a per-tenant advisory lock; SQLite: its write lock), so two requests at once cannot both take the last place.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, delete, func, insert, or_, select, text, update

from finetune.data.read import read_file
from finetune.data.replay_mix import replay_count
from finetune.data.stats import BYTES_PER_TOKEN_ESTIMATE, build_all_records, estimate_record_tokens
from finetune.rules.replay import AUTO_RATIO
from finetune.service.api_error import APIError
from finetune.service.storage.db import api_keys, files, job_token_holds, jobs, tenant_quotas, transaction
from finetune.service.tenant_names import DEFAULT_TENANT  # the row whose values hold for every tenant without its own
from finetune.settings.errors import UserError

QUOTAS = ("max_running_jobs", "max_queued_jobs", "max_stored_bytes", "max_monthly_tokens")
WAITING = ("queued", "validating_files")  # store.CLAIMABLE (store imports this module)
ENDED = ("succeeded", "failed", "cancelled")  # store.TERMINAL
QUEUE_RETRY_SECONDS = 30  # a queued job's wait is unknown: ask again in a while (the SDK retries 429 after it)
_CLAIM_LOCK = 7254002  # PostgreSQL advisory locks (db.py's migration lock is 7254001)
_TENANT_LOCK = 7254003


def _is_postgres(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def _held(t: float):
    """A job a worker holds now: its lease still runs."""
    return and_(jobs.c.claim_token.is_not(None), jobs.c.lease_expires_at >= t)


def lock_tenant(conn: Connection, tenant: str) -> None:
    """PostgreSQL: one check of a tenant's quotas, or of whether its jobs need a file, at a time (SQLite's write
    transaction is one at a time already)."""
    if _is_postgres(conn):
        conn.execute(text(f"SELECT pg_advisory_xact_lock({_TENANT_LOCK}, hashtext(:tenant))"), {"tenant": tenant})


# ---------------------------------------------------------------------------------------------- what is set


def _effective(rows: dict[str, Any], tenant: str) -> dict[str, int | None]:
    own, default = rows.get(tenant) or {}, rows.get(DEFAULT_TENANT) or {}
    return {name: own[name] if own.get(name) is not None else default.get(name) for name in QUOTAS}


def limits_of(conn: Connection, tenant: str) -> dict[str, int | None]:
    """The quotas that hold for `tenant` (None: no quota of that kind)."""
    query = select(tenant_quotas).where(tenant_quotas.c.tenant.in_([tenant, DEFAULT_TENANT]))
    return _effective({r.tenant: dict(r._mapping) for r in conn.execute(query)}, tenant)


def set_quotas(engine: Engine, tenant: str, values: dict[str, int | None]) -> dict[str, Any]:
    """Set (a number) or remove (None) some of `tenant`'s own quotas; the others stay. Returns its row."""
    unknown = set(values) - set(QUOTAS)
    if unknown:
        raise ValueError(f"not a quota: {', '.join(sorted(unknown))}")
    with transaction(engine, write=True) as conn:
        where = tenant_quotas.c.tenant == tenant
        found = conn.execute(select(tenant_quotas).where(where)).first()
        if found is None:
            conn.execute(insert(tenant_quotas).values(tenant=tenant, updated_at=int(time.time()), **values))
        else:
            conn.execute(update(tenant_quotas).where(where).values(updated_at=int(time.time()), **values))
        row = dict(conn.execute(select(tenant_quotas).where(where)).one()._mapping)
        if all(row[name] is None for name in QUOTAS):  # nothing of its own left: no row
            conn.execute(delete(tenant_quotas).where(where))
        return row


def all_quotas(engine: Engine) -> dict[str, dict[str, int | None]]:
    """Every tenant's own quotas (and the default's, under "*"), by tenant."""
    with transaction(engine) as conn:
        rows = conn.execute(select(tenant_quotas).order_by(tenant_quotas.c.tenant))
        return {r.tenant: {name: r._mapping[name] for name in QUOTAS} for r in rows}


def known_tenants(engine: Engine) -> list[str]:
    """Tenants with a key, a file, a job or quotas of their own."""
    with transaction(engine) as conn:
        found: set[str] = set()
        for column in (api_keys.c.tenant, files.c.tenant, jobs.c.tenant, tenant_quotas.c.tenant):
            found |= set(conn.execute(select(column).distinct()).scalars())
    return sorted(found - {DEFAULT_TENANT})


# ---------------------------------------------------------------------------------------------- what is used


def running_jobs(conn: Connection, tenant: str, t: float) -> int:
    return conn.execute(select(func.count()).select_from(jobs).where(jobs.c.tenant == tenant, _held(t))).scalar()


def queued_jobs(conn: Connection, tenant: str, t: float, besides: str | None = None) -> int:
    free = or_(jobs.c.claim_token.is_(None), jobs.c.lease_expires_at < t)
    query = select(func.count()).select_from(jobs).where(jobs.c.tenant == tenant, jobs.c.status.in_(WAITING), free)
    if besides is not None:
        query = query.where(jobs.c.id != besides)
    return conn.execute(query).scalar()


def stored_bytes(conn: Connection, tenant: str) -> int:
    return int(conn.execute(select(func.coalesce(func.sum(files.c.bytes), 0)).where(files.c.tenant == tenant)).scalar())


def month_bounds(t: float) -> tuple[int, int]:
    """The UTC calendar month of `t`: [its first second, the next month's first second)."""
    day = datetime.fromtimestamp(t, UTC)
    start = datetime(day.year, day.month, 1, tzinfo=UTC)
    end = datetime(day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=UTC)
    return int(start.timestamp()), int(end.timestamp())


def monthly_tokens(conn: Connection, tenant: str, start: int, end: int) -> tuple[int, int]:
    """(billed, pending): the billed tokens of the tenant's jobs created in [start, end) that succeeded, and what
    its jobs not ended are expected to bill (the plan's estimate, else the hold of its file's estimate)."""
    billed = case((jobs.c.status == "succeeded", func.coalesce(jobs.c.trained_tokens, 0)), else_=0)
    expected = func.coalesce(jobs.c.estimate_billed_tokens, job_token_holds.c.tokens, 0)
    pending = case((jobs.c.status.in_(ENDED), 0), else_=expected)
    query = (
        select(func.coalesce(func.sum(billed), 0), func.coalesce(func.sum(pending), 0))
        .select_from(jobs.outerjoin(job_token_holds, job_token_holds.c.job_id == jobs.c.id))
        .where(jobs.c.tenant == tenant, jobs.c.created_at >= start, jobs.c.created_at < end)
    )
    used, held = conn.execute(query).one()
    return int(used), int(held)


def report(engine: Engine, tenant: str) -> dict[str, dict[str, Any]]:
    """GET /v1/usage's `quotas`: each quota's limit (None: none) beside what the tenant uses now."""
    t = time.time()
    start, end = month_bounds(t)
    with transaction(engine) as conn:
        limits = limits_of(conn, tenant)
        billed, pending = monthly_tokens(conn, tenant, start, end)
        return {
            "running_jobs": {"used": running_jobs(conn, tenant, t), "limit": limits["max_running_jobs"]},
            "queued_jobs": {"used": queued_jobs(conn, tenant, t), "limit": limits["max_queued_jobs"]},
            "stored_bytes": {"used": stored_bytes(conn, tenant), "limit": limits["max_stored_bytes"]},
            "monthly_tokens": {"used": billed, "pending": pending, "limit": limits["max_monthly_tokens"],
                               "period_start": start, "period_end": end},
        }  # fmt: skip


# ---------------------------------------------------------------------------------------------- the checks


def tenants_at_running_quota(conn: Connection, t: float) -> list[str]:
    """store.claim's: the tenants whose workers' jobs reach their running quota (their jobs wait). With no running
    quota set, one read of a small table; with one on PostgreSQL, claims take turns (an advisory lock), so two
    workers cannot both take a tenant's last place."""
    limits = dict(conn.execute(select(tenant_quotas.c.tenant, tenant_quotas.c.max_running_jobs)).all())
    if all(limit is None for limit in limits.values()):
        return []
    if _is_postgres(conn):
        conn.execute(text(f"SELECT pg_advisory_xact_lock({_CLAIM_LOCK})"))
    counts = conn.execute(select(jobs.c.tenant, func.count()).where(_held(t)).group_by(jobs.c.tenant)).all()
    default = limits.get(DEFAULT_TENANT)
    busy = []
    for tenant, running in counts:
        limit = limits[tenant] if limits.get(tenant) is not None else default
        if limit is not None and running >= limit:
            busy.append(tenant)
    return busy


def admit_job(tenant: str, tokens: int | None, shown: str) -> Callable[[Connection, dict], None]:
    """For store.create_job, inside the write that added the job `row`: 429 past the queued-jobs quota, 403 past
    the monthly tokens with the job's `tokens` (its estimate, from the file `shown`; None: not estimated)."""

    def admit(conn: Connection, row: dict) -> None:
        lock_tenant(conn, tenant)
        limits, t = limits_of(conn, tenant), time.time()
        limit = limits["max_queued_jobs"]
        if limit is not None and (waiting := queued_jobs(conn, tenant, t, besides=row["id"])) >= limit:
            raise APIError(
                429,
                f"tenant {tenant} has {waiting} queued jobs, its quota is {limit} (max queued jobs): a new job can be "
                f"created once a worker takes one of them (retry after {QUEUE_RETRY_SECONDS} s).",
                "queued_jobs_quota_exceeded",
                kind="rate_limit_exceeded",
                headers={"Retry-After": str(QUEUE_RETRY_SECONDS)},
            )
        limit = limits["max_monthly_tokens"]
        if limit is None or tokens is None:
            return
        start, end = month_bounds(t)
        billed, pending = monthly_tokens(conn, tenant, start, end)
        if billed + pending + tokens > limit:
            month = datetime.fromtimestamp(start, UTC).strftime("%Y-%m")
            renews = datetime.fromtimestamp(end, UTC).date().isoformat()
            raise APIError(
                403,
                f"tenant {tenant} has {billed + pending} trained tokens this month ({month}: {billed} billed, "
                f"{pending} expected from jobs not ended), its quota is {limit} (max monthly tokens): this job would "
                f"train about {tokens} more (estimated from {shown}). The quota renews on {renews} (UTC).",
                "monthly_tokens_quota_exceeded",
                kind="insufficient_quota",
                headers={"Retry-After": str(max(1, end - int(t)))},
            )
        conn.execute(insert(job_token_holds).values(job_id=row["id"], tokens=tokens))

    return admit


def admit_file(tenant: str) -> Callable[[Connection, dict], None]:
    """For store.add_file, inside the write that added the file `row`: 403 past the stored-bytes quota."""

    def admit(conn: Connection, row: dict) -> None:
        lock_tenant(conn, tenant)
        limit = limits_of(conn, tenant)["max_stored_bytes"]
        if limit is None:
            return
        stored = stored_bytes(conn, tenant)
        if stored > limit:
            before = stored - row["bytes"]
            raise APIError(
                403,
                f"tenant {tenant} stores {before} bytes in files, its quota is {limit} bytes (max stored bytes): "
                f"{row['filename']} ({row['bytes']} bytes) would make {stored}. Delete files it no longer needs "
                "(DELETE /v1/files/{file_id}) to make room.",
                "stored_bytes_quota_exceeded",
                param="file",
                kind="insufficient_quota",
            )

    return admit


def refuse_when_full(engine: Engine, tenant: str) -> None:
    """Before an upload is received: 403 at once when the tenant's files already fill its stored-bytes quota."""
    with transaction(engine) as conn:
        limit = limits_of(conn, tenant)["max_stored_bytes"]
        stored = stored_bytes(conn, tenant) if limit is not None else 0
    if limit is not None and stored >= limit:
        raise APIError(
            403,
            f"tenant {tenant} stores {stored} bytes in files, its quota is {limit} bytes (max stored bytes): no upload "
            "fits. Delete files it no longer needs (DELETE /v1/files/{file_id}) to make room.",
            "stored_bytes_quota_exceeded",
            param="file",
            kind="insufficient_quota",
        )


def monthly_limit(engine: Engine, tenant: str) -> int | None:
    with transaction(engine) as conn:
        return limits_of(conn, tenant)["max_monthly_tokens"]


def file_token_estimate(path: Path, run_settings: dict[str, Any], general: Path | None = None) -> int:
    """About the tokens a job on `path` bills before it is planned: the file's records estimated from their text (as
    `finetune plan` without a model), and with `general` (its general_data upload: the tenant's own conversations,
    billed like the file, rules/billing.py) the general rows replay mixes in at its ratio (up to 10 per training
    record), times the epochs when they are given (once when Auto chooses them)."""
    tokens, records = _estimate(path, run_settings.get("format"), run_settings.get("record_policy") or "all")
    if general is not None:
        tokens += _general_estimate(general, run_settings.get("replay"), records)
    epochs = run_settings.get("epochs")
    return tokens * (epochs if isinstance(epochs, int) and epochs > 0 else 1)


def _estimate(path: Path, data_format: str | None, record_policy: str) -> tuple[int, int]:
    """(tokens, records) of a file, estimated from its text; its size / bytes per token for a file that is not chat
    conversations (preference pairs, or a file validation will refuse)."""
    try:
        records = build_all_records(read_file(path, data_format).conversations, record_policy)
    except UserError:
        records = []
    if not records:
        return math.ceil(path.stat().st_size / BYTES_PER_TOKEN_ESTIMATE), 0
    return sum(estimate_record_tokens(r, 0).total for r in records), len(records)


def _general_estimate(path: Path, replay: Any, team_records: int) -> int:
    """The tokens of the general rows mixed in per epoch: `replay` rows per training record (Auto's ratio when not
    given), each the general file's average row (rows go round again when the file has fewer)."""
    try:
        ratio = AUTO_RATIO if replay in (None, "auto") else float(replay)
    except (TypeError, ValueError):  # "off": nothing is mixed in (a job cannot give general_data then)
        ratio = 0.0
    tokens, rows = _estimate(path, None, "all")
    return round(tokens / rows * replay_count(ratio, team_records)) if rows else tokens
