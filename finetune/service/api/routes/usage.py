"""The route GET /v1/usage (ours): answers the calling tenant its trained tokens, device time and cost, per job,
model or UTC day and in total, estimate beside actual (storage/usage.py sums them), and its quotas beside what it
uses now (storage/quotas.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from finetune.rules.billing import RULE
from finetune.service.api.auth import current_tenant
from finetune.service.api.deps import store_of
from finetune.service.api_error import APIError
from finetune.service.storage.quotas import report as quota_report
from finetune.service.storage.usage import GROUPS, parse_time, tenant_usage
from finetune.settings.wording import render

router = APIRouter(prefix="/v1", dependencies=[Depends(current_tenant)])


@router.get("/usage")
def usage(
    request: Request,
    tenant: str = Depends(current_tenant),
    start: str | None = None,
    end: str | None = None,
    group_by: str = "job",
) -> dict:
    """Jobs created in [start, end) (unix seconds or ISO 8601 dates/times, UTC), grouped by job (the default),
    model or day."""
    if group_by not in GROUPS:
        raise APIError(400, f"group_by must be one of {', '.join(GROUPS)}, got {group_by!r}.", "invalid_value",
                       "group_by")  # fmt: skip
    bounds = {}
    for name, given in (("start", start), ("end", end)):
        try:
            bounds[name] = parse_time(given, name)
        except ValueError as exc:
            raise APIError(400, f"{exc}.", "invalid_value", name) from None
    answer = tenant_usage(store_of(request), tenant, bounds["start"], bounds["end"], group_by)
    billed = render(RULE, "api")  # what billed tokens are (rules/billing.py), for a tenant reconciling its bill
    return answer | {"quotas": quota_report(store_of(request).engine, tenant), "billing_rule": billed}
