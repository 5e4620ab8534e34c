"""DELETE /v1/fine_tuning/jobs/{id}: an ended job's data and artifacts go (run folder, checkpoints, weights, its
fine-tuned model, events, logs, results files, token cache entries: deletion.py); its row stays as a tombstone
that the job object shows (`deleted`, `deleted_at`, `removed`). A job that has not ended is refused: cancel first."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from finetune.service.api.auth import current_tenant
from finetune.service.api.deps import options_of, store_of
from finetune.service.api.openai_errors import not_found
from finetune.service.api_error import APIError
from finetune.service.storage import deletion

router = APIRouter(prefix="/v1/fine_tuning", dependencies=[Depends(current_tenant)])


@router.delete("/jobs/{job_id}")
def delete_job(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    try:
        job = deletion.delete_job(options_of(request), store_of(request), tenant, job_id)
    except deletion.JobNotDeletable as exc:
        # 400, not 409: the SDK retries a 409 (errors.py); the message says what to do instead
        raise APIError(400, str(exc), "job_not_ended", "fine_tuning_job_id") from None
    if job is None:
        raise not_found("fine-tuning job", job_id, "fine_tuning_job_id")
    return {
        "id": job_id,
        "object": "fine_tuning.job",
        "deleted": True,
        "deleted_at": job["deleted_at"],
        "removed": job["removed"] or [],
    }
