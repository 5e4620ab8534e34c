"""GET /v1/audit (ours): the calling tenant's audit records (storage/audit_trail.py), newest first (`order=asc`: oldest first),
paged like the other lists (`after` = the last id of the previous page, `limit`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from finetune.service.api.auth import current_tenant
from finetune.service.api.deps import check_limit
from finetune.service.api.objects import page_object
from finetune.service.api_error import APIError
from finetune.service.storage.audit_trail import audit_object

router = APIRouter(prefix="/v1", dependencies=[Depends(current_tenant)])


@router.get("/audit")
def list_audit(
    request: Request,
    tenant: str = Depends(current_tenant),
    after: str | None = None,
    limit: int = 20,
    order: str = "desc",
) -> dict:
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be asc or desc.", "invalid_value", "order")
    page = request.app.state.audit.page(tenant, after, check_limit(limit, 1000), ascending=order == "asc")
    return page_object(page, audit_object)
