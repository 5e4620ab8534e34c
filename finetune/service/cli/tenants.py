"""What `finetune serve tenants set|unset|list` runs (tenants_parser.py holds its parser): the operator's quotas
per tenant, in the database every API process and worker reads (quotas.py); `list` shows each beside what the
tenant uses now, as GET /v1/usage shows a tenant."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from finetune.service.cli.from_flags import open_store, options_from
from finetune.service.storage.audit_trail import AuditLog
from finetune.service.storage.quotas import DEFAULT_TENANT, QUOTAS, all_quotas, known_tenants, report, set_quotas
from finetune.settings.errors import UserError

SHOWN = {  # quota -> its key in quotas.report
    "max_running_jobs": "running_jobs",
    "max_queued_jobs": "queued_jobs",
    "max_stored_bytes": "stored_bytes",
    "max_monthly_tokens": "monthly_tokens",
}


def run_tenants(args) -> int:
    tenant = getattr(args, "tenant", None)
    if tenant is not None and not tenant.strip():
        raise UserError("a tenant's name cannot be empty (or * for the default of every tenant)")
    if args.tenants_command == "set":
        values = {name: getattr(args, name) for name in QUOTAS if hasattr(args, name)}
        if not values:
            flags = ", ".join("--" + name.replace("_", "-") for name in QUOTAS)
            raise UserError(f"`tenants set {tenant}` sets nothing: give at least one of {flags}")
        if values.get("max_running_jobs") == 0:
            raise UserError("--max-running-jobs must be at least 1 (0 would keep the tenant's jobs queued forever)")
    elif args.tenants_command == "unset":
        values = {name: None for name in QUOTAS if getattr(args, name, False)} or dict.fromkeys(QUOTAS)
    store = open_store(options_from(args))
    try:
        if args.tenants_command == "list":
            return _list(store, args.json)
        row = set_quotas(store.engine, tenant, values)
        AuditLog(store.engine).append(f"quota.{args.tenants_command}", tenant=tenant, object_id=tenant)
        own = {name: row[name] for name in QUOTAS}
        who = "every tenant without its own value" if tenant == DEFAULT_TENANT else f"tenant {tenant!r}"
        shown = ", ".join(f"{name} {_limit(value)}" for name, value in own.items() if value is not None)
        print(f"quotas of {who}: {shown or 'none of its own'}")
    finally:
        store.close()
    return 0


def _list(store, as_json: bool) -> int:
    own = all_quotas(store.engine)
    tenants = known_tenants(store.engine)
    reports = {tenant: report(store.engine, tenant) for tenant in tenants}
    if as_json:
        data = [{"tenant": t, "own": own.get(t, dict.fromkeys(QUOTAS)), "quotas": reports[t]} for t in tenants]
        print(json.dumps({"object": "list", "default": own.get(DEFAULT_TENANT, dict.fromkeys(QUOTAS)), "data": data},
                         indent=2))  # fmt: skip
        return 0
    month = datetime.now(UTC).strftime("%Y-%m")
    header = ("tenant", "running jobs", "queued jobs", "stored bytes", f"tokens {month} (+ expected)")
    rows = [header]
    default = own.get(DEFAULT_TENANT)
    if default:
        rows.append((DEFAULT_TENANT, *(f"-/{_limit(default[name])}" for name in QUOTAS)))
    for tenant in tenants:
        cells = []
        for name in QUOTAS:
            part = reports[tenant][SHOWN[name]]
            used = f"{part['used']}+{part['pending']}" if "pending" in part else str(part["used"])
            inherited = (own.get(tenant) or {}).get(name) is None and part["limit"] is not None
            cells.append(f"{used}/{_limit(part['limit'])}{' (*)' if inherited else ''}")
        rows.append((tenant, *cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print("(used/quota; - no quota; (*) the default's, set with `tenants set '*'`)")
    return 0


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)
