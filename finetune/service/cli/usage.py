"""The command `finetune usage [--tenant T] [--since DATE] [--json]`: prints the operator's view of usage, per
tenant and model, estimate beside actual, from the same sums GET /v1/usage answers a tenant (storage/usage.py)."""

from __future__ import annotations

import json

from finetune.service.cli.from_flags import open_store, options_from
from finetune.service.storage.usage import CURRENCY, parse_time, tenant_usage, usage_tenants
from finetune.settings.errors import UserError


def run_usage(args) -> int:
    try:
        since = parse_time(args.since, "--since")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    store = open_store(options_from(args))
    try:
        tenants = [args.tenant] if args.tenant else usage_tenants(store, since)
        reports = [tenant_usage(store, tenant, start=since, group_by="model") for tenant in tenants]
    finally:
        store.close()
    if args.json:
        print(json.dumps({"object": "usage", "since": since, "tenants": reports, "total": _total(reports)}, indent=2))
    else:
        print(_table(reports, since))
    return 0


def _total(reports: list[dict]) -> dict:
    """The sum over tenants (each tenant's total is already the sum over its jobs)."""
    totals = [r["total"] for r in reports]

    def add(parts: list[dict], key: str):
        found = [p[key] for p in parts if p[key] is not None]
        return sum(found) if found else None

    def part(parts: list[dict]) -> dict:
        summed = {
            key: add(parts, key) for key in ("billed_tokens", "device_seconds", "token_cost", "time_cost", "cost")
        }
        summed["billed_tokens"] = summed["billed_tokens"] or 0
        summed["device_seconds"] = summed["device_seconds"] or 0.0
        return summed | {"currency": CURRENCY if summed["cost"] is not None else None}

    return {"jobs": sum(t["jobs"] for t in totals), **part(totals), "estimate": part([t["estimate"] for t in totals])}


def _table(reports: list[dict], since: int | None) -> str:
    header = ("tenant", "model", "jobs", "billed tokens (est.)", "device hours (est.)", f"cost {CURRENCY} (est.)")
    rows = [header]
    for report in reports:
        for group in report["data"]:
            rows.append(_row(report["tenant"], group["key"], group))
    rows.append(_row("all", "", _total(reports)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(_cell(cell, w, i) for i, (cell, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    scope = "every job" if since is None else "jobs created since the given date"
    return "\n".join([*lines, f"({scope}; actual = jobs that ended, estimate = jobs planned)"])


def _cell(text: str, width: int, column: int) -> str:
    return text.ljust(width) if column < 2 else text.rjust(width)  # names left, numbers right


def _row(tenant: str, model: str, usage: dict) -> tuple[str, ...]:
    est = usage["estimate"]

    def money(value: float | None) -> str:
        return "-" if value is None else f"{value:,.{4 if value < 1 else 2}f}"

    def hours(seconds: float) -> str:
        return f"{seconds / 3600:,.{4 if seconds < 3600 else 2}f}"

    return (
        tenant,
        model,
        str(usage["jobs"]),
        f"{usage['billed_tokens']:,} ({est['billed_tokens']:,})",
        f"{hours(usage['device_seconds'])} ({hours(est['device_seconds'])})",
        f"{money(usage['cost'])} ({money(est['cost'])})",
    )
