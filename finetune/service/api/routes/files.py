"""/v1/files: upload (streamed; a gzip upload stored decompressed; Idempotency-Key honoured), list, retrieve,
delete, content. Bytes live at files/<id>; the name a caller gave is only ever shown, never used as a path."""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from finetune.service.api.auth import current_tenant
from finetune.service.api.deps import check_limit, options_of, store_of
from finetune.service.api.idempotency import digest_file, once
from finetune.service.api.objects import file_object, page_object
from finetune.service.api.openai_errors import not_found
from finetune.service.api.prometheus import metrics_of
from finetune.service.api.upload import Upload, gunzip_upload, receive_upload
from finetune.service.api_error import APIError
from finetune.service.storage import bucket_copy, deletion
from finetune.service.storage.quotas import admit_file, refuse_when_full
from finetune.service.storage.store import new_id

router = APIRouter(prefix="/v1", dependencies=[Depends(current_tenant)])
UPLOAD_PURPOSES = ("fine-tune", "assistants", "batch", "vision", "user_data", "evals")


@router.post("/files")
async def create_file(request: Request, tenant: str = Depends(current_tenant)) -> dict:
    options = options_of(request)
    refuse_when_full(store_of(request).engine, tenant)  # 403 before receiving a byte when its quota is full
    upload = await receive_upload(request, options.uploads_dir, options.max_upload_bytes)
    try:
        purpose = upload.fields.get("purpose", "")
        if purpose not in UPLOAD_PURPOSES:
            raise APIError(400, f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}.", "invalid_value", "purpose")

        async def make() -> tuple[str, dict]:
            if purpose == "fine-tune":  # data: a gzip file is stored decompressed (read like the CLI reads .gz)
                await run_in_threadpool(gunzip_upload, upload, options.max_upload_bytes)
            row = _keep(request, tenant, upload, purpose)
            return row["id"], file_object(row)

        digest = lambda: digest_file(upload.temp, purpose, upload.filename)  # noqa: E731
        return await once(request, tenant, "POST /v1/files", digest, make)
    finally:
        upload.temp.unlink(missing_ok=True)  # kept (moved), refused, or a replayed answer's copy


def _keep(request: Request, tenant: str, upload: Upload, purpose: str) -> dict:
    """Move the upload to files/<id>, then commit its row (a crash in between leaves no row without bytes)."""
    file_id = new_id("file")
    final = options_of(request).files_dir / file_id
    os.replace(upload.temp, final)
    try:
        row = store_of(request).add_file(
            tenant, file_id, upload.filename[:512], purpose, upload.size, admit=admit_file(tenant)
        )  # 403 past the stored-bytes quota (quotas.py)
        bucket_copy.push(options_of(request), final)  # --storage: the bucket holds it before its id is answered
    except BaseException:
        final.unlink(missing_ok=True)
        raise
    metrics_of(request).uploaded(tenant, upload.size)
    return row


@router.get("/files")
def list_files(
    request: Request,
    tenant: str = Depends(current_tenant),
    after: str | None = None,
    limit: int = 10_000,
    order: str = "desc",
    purpose: str | None = None,
) -> dict:
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be asc or desc.", "invalid_value", "order")
    page = store_of(request).list_files(tenant, after, check_limit(limit), order, purpose)
    return page_object(page, file_object)


def find_file(request: Request, tenant: str, file_id: str) -> dict | None:
    """The caller's file, or None (another tenant's reads like a missing one): the one lookup of a file id, in
    these routes, the jobs' and the dashboard's."""
    return store_of(request).get_file(tenant, file_id)


def _file(request: Request, tenant: str, file_id: str) -> dict:
    row = find_file(request, tenant, file_id)
    if row is None:
        raise not_found("file", file_id, "file_id")
    return row


@router.get("/files/{file_id}")
def retrieve_file(file_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    return file_object(_file(request, tenant, file_id))


@router.delete("/files/{file_id}")
def delete_file(file_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    """The file and every copy of its content the service keeps (deletion.py); refused while a job needs it."""
    _file(request, tenant, file_id)
    try:
        removed = deletion.delete_file(options_of(request), store_of(request), tenant, file_id)
    except deletion.FileInUse as exc:
        named = ", ".join(f"{job['id']} ({job['status']})" for job in exc.jobs)
        raise APIError(
            400,
            f"File {file_id} is used by job(s) that have not ended: {named}. Cancel them (or wait until they end), "
            "then delete the file.",
            "file_in_use",
            "file_id",
        ) from None
    return {"id": file_id, "object": "file", "deleted": True, "removed": [item.shown() for item in removed]}


@router.get("/files/{file_id}/content")
def file_content(file_id: str, request: Request, tenant: str = Depends(current_tenant)):
    row = _file(request, tenant, file_id)
    path = bucket_copy.pull(options_of(request), options_of(request).files_dir / row["id"])  # --storage
    if not path.is_file():
        raise not_found("file content", file_id, "file_id")
    media = "text/csv" if row["filename"].endswith(".csv") else "application/octet-stream"
    return FileResponse(path, media_type=media)
