"""Usage's arithmetic and queries: what a job used and what it costs, and the sums over jobs that the API answers
a tenant (GET /v1/usage: api/routes/usage.py) and the operator reads (`finetune usage`: cli/usage.py).

    billed tokens   the tenant's own training tokens once per step that reads them (OpenAI's `trained_tokens`;
                    rules/billing.py: its training file and its general_data, not the base's replay rows)
    device seconds  how long the job's trainer ran (every attempt, start to exit) x the devices it trains on
    cost            billed tokens / 1e6 x price per million tokens  +  device seconds / 3600 x GPU-hour price

The *estimate* is the plan's (its tokens, its estimated training time x devices), recorded when the worker plans
the job; the *actual* is what the job used, given once it ends. Both are costed at the prices the job was planned
at, recorded on it, so a later price change rewrites no history. What a job that did not succeed is billed: the
device time it held, never tokens (no model came of them; `trained_tokens` is only set on success).

The sums are SQL over the jobs' columns; job_usage is the same arithmetic for one job (tests check they agree).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import case, func, select

from finetune.service.storage.db import jobs, transaction
from finetune.service.storage.store import TERMINAL, Store

CURRENCY = "USD"  # what --price-per-million-tokens and --gpu-hour-price are in (the dashboard shows $)
GROUPS = ("job", "model", "day")
DAY = 86400


def priced(
    billed_tokens: int | None, device_seconds: float | None, per_million: float | None, per_hour: float | None
) -> dict[str, Any]:
    """The usage keys of one job (or one sum): its numbers and their cost; a cost is None without its price."""
    token_cost = None if per_million is None or billed_tokens is None else billed_tokens / 1e6 * per_million
    time_cost = None if per_hour is None or device_seconds is None else device_seconds / 3600 * per_hour
    cost = None if token_cost is None and time_cost is None else (token_cost or 0.0) + (time_cost or 0.0)
    return {
        "billed_tokens": billed_tokens,
        "device_seconds": device_seconds,
        "token_cost": token_cost,
        "time_cost": time_cost,
        "cost": cost,
        "currency": CURRENCY if cost is not None else None,
    }


def job_usage(row: dict) -> dict[str, dict | None]:
    """The job object's `usage`: the estimate once planned, the actual once ended (None before)."""
    prices = row.get("price_per_million_tokens"), row.get("gpu_hour_price")
    estimate = None
    if row.get("estimate_billed_tokens") is not None or row.get("estimate_device_seconds") is not None:
        estimate = priced(row.get("estimate_billed_tokens"), row.get("estimate_device_seconds"), *prices)
    actual = None
    if row["status"] in TERMINAL:
        billed = (row.get("trained_tokens") or 0) if row["status"] == "succeeded" else 0
        actual = priced(billed, row.get("device_seconds") or 0.0, *prices)
    return {"estimate": estimate, "actual": actual}


def prices_of(options) -> dict[str, float | None]:
    """The RunConfig prices a plan made by this process (a worker's, or POST /v1/fine_tuning/plan) is costed at."""
    return {"price_per_million_tokens": options.price_per_million_tokens, "gpu_hour_price": options.gpu_hour_price}


def planned_values(plan) -> dict[str, Any]:
    """The job's columns when it is planned: the plan's estimate and the prices its cost was estimated at."""
    cost = plan.cost
    return {
        "estimate_billed_tokens": plan.tokens_processed,
        "estimate_device_seconds": cost.seconds * cost.devices if cost.seconds is not None else None,
        "price_per_million_tokens": cost.price_per_million_tokens,
        "gpu_hour_price": cost.gpu_hour_price,
    }


class DeviceClock:
    """A job's device seconds while one attempt runs: what its earlier attempts used, plus this one's time so far
    x the devices it trains on. The worker writes it with each progress write and when the trainer exits."""

    def __init__(self, before: float | None, devices: int) -> None:
        self.before = before or 0.0
        self.devices = devices or 1
        self.started = time.monotonic()

    def values(self) -> dict[str, float]:
        return {"device_seconds": self.before + (time.monotonic() - self.started) * self.devices}


# ---------------------------------------------------------------------------------------------- sums


def _sum_columns() -> list:
    ended = jobs.c.status.in_(TERMINAL)
    billed = case((jobs.c.status == "succeeded", func.coalesce(jobs.c.trained_tokens, 0)), (ended, 0))
    seconds = case((ended, func.coalesce(jobs.c.device_seconds, 0.0)))  # NULL (left out of sums) until it ends
    per_million, per_hour = jobs.c.price_per_million_tokens, jobs.c.gpu_hour_price
    return [
        func.count().label("jobs"),
        func.sum(billed).label("billed_tokens"),
        func.sum(seconds).label("device_seconds"),
        func.sum(billed / 1e6 * per_million).label("token_cost"),
        func.sum(seconds / 3600 * per_hour).label("time_cost"),
        func.sum(jobs.c.estimate_billed_tokens).label("estimate_billed_tokens"),
        func.sum(jobs.c.estimate_device_seconds).label("estimate_device_seconds"),
        func.sum(jobs.c.estimate_billed_tokens / 1e6 * per_million).label("estimate_token_cost"),
        func.sum(jobs.c.estimate_device_seconds / 3600 * per_hour).label("estimate_time_cost"),
    ]


def _usage_of_sums(row: dict) -> dict[str, Any]:
    def part(prefix: str) -> dict[str, Any]:
        token_cost, time_cost = row[f"{prefix}token_cost"], row[f"{prefix}time_cost"]
        cost = None if token_cost is None and time_cost is None else (token_cost or 0.0) + (time_cost or 0.0)
        return {
            "billed_tokens": int(row[f"{prefix}billed_tokens"] or 0),
            "device_seconds": float(row[f"{prefix}device_seconds"] or 0.0),
            "token_cost": None if token_cost is None else float(token_cost),
            "time_cost": None if time_cost is None else float(time_cost),
            "cost": None if cost is None else float(cost),
            "currency": CURRENCY if cost is not None else None,
        }

    return {"jobs": int(row["jobs"]), **part(""), "estimate": part("estimate_")}


def _group_key(group_by: str):
    if group_by == "model":
        return jobs.c.model
    if group_by == "day":
        return jobs.c.created_at // DAY  # the UTC day (creation times are unix seconds)
    return jobs.c.id


def _sums(store: Store, where: list, group_by: str | None) -> list[dict]:
    """One row of sums per group (or one row in all with group_by None), the group's key first."""
    key = _group_key(group_by) if group_by else None
    query = select(*([key.label("key")] if key is not None else []), *_sum_columns()).where(*where)
    if key is not None:
        order = func.min(jobs.c.row) if group_by == "job" else key
        query = query.group_by(key).order_by(order)
    with transaction(store.engine) as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def tenant_usage(
    store: Store, tenant: str, start: int | None = None, end: int | None = None, group_by: str = "job"
) -> dict[str, Any]:
    """GET /v1/usage: the tenant's jobs created in [start, end), summed per job, model or UTC day, and in total.
    Keeps the keys the answer had before groups (`total_trained_tokens`, `total_cost`; per job rows by default)."""
    where = [jobs.c.tenant == tenant]
    where += [jobs.c.created_at >= start] if start is not None else []
    where += [jobs.c.created_at < end] if end is not None else []
    data = []
    for row in _sums(store, where, group_by):
        data.append({"key": _shown_key(row["key"], group_by), **_usage_of_sums(row)})
    if group_by == "job":
        _add_job_fields(store, tenant, data)
    total = _usage_of_sums(_sums(store, where, None)[0])
    return {
        "object": "usage",
        "tenant": tenant,
        "start": start,
        "end": end,
        "group_by": group_by,
        "data": data,
        "total": total,
        "total_trained_tokens": total["billed_tokens"],
        "total_cost": total["cost"],
    }


def _shown_key(key: Any, group_by: str) -> str:
    return datetime.fromtimestamp(int(key) * DAY, UTC).date().isoformat() if group_by == "day" else str(key)


def _add_job_fields(store: Store, tenant: str, rows: list[dict]) -> None:
    """Per job rows also carry what they carried before groups existed."""
    wanted = [r["key"] for r in rows]
    if not wanted:
        return
    columns = (jobs.c.id, jobs.c.model, jobs.c.status, jobs.c.fine_tuned_model, jobs.c.trained_tokens, jobs.c.report)
    with transaction(store.engine) as conn:
        found = {
            r.id: r._mapping
            for r in conn.execute(select(*columns).where(jobs.c.tenant == tenant, jobs.c.id.in_(wanted)))
        }
    for row in rows:
        job = found[row["key"]]
        row.update(job_id=job["id"], model=job["model"], status=job["status"],
                   fine_tuned_model=job["fine_tuned_model"], trained_tokens=job["trained_tokens"],
                   billing=(job["report"] or {}).get("billing"))  # fmt: skip  # what trained_tokens bills, and why


def usage_tenants(store: Store, since: int | None = None) -> list[str]:
    """The operator's view (`finetune usage`): every tenant with a job created since `since`."""
    query = select(jobs.c.tenant).distinct().order_by(jobs.c.tenant)
    if since is not None:
        query = query.where(jobs.c.created_at >= since)
    with transaction(store.engine) as conn:
        return list(conn.execute(query).scalars())


LAST_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z, the last time an ISO 8601 date can name


def parse_time(text: str | None, name: str) -> int | None:
    """Unix seconds, or an ISO 8601 date or time (a time without a zone is UTC). ValueError names `name`."""
    if text is None or text == "":
        return None
    wrong = ValueError(
        f"{name} must be unix seconds or an ISO 8601 date (2025-01-31) or time (2025-01-31T12:00:00Z), got {text!r}"
    )
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not abs(seconds) <= LAST_SECOND:  # inf, nan, or past the year 9999: no time a job was created at
            raise wrong
        return int(seconds)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise wrong from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp())
