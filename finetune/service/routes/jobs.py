"""/v1/fine_tuning: jobs (create, list, retrieve, cancel, pause, resume, events, checkpoints, metrics) and
our POST /v1/fine_tuning/plan. Creating a job only records it (status validating_files); a worker validates,
plans and trains it."""

from __future__ import annotations

import re
import secrets
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from finetune.errors import UserError
from finetune.service import core
from finetune.service.auth import current_tenant
from finetune.service.deps import check_limit, settings_of, store_of
from finetune.service.errors import APIError, not_found
from finetune.service.integrations import run_settings_for
from finetune.service.objects import checkpoint_object, event_object, job_object, page_object
from finetune.service.store import IllegalTransition

router = APIRouter(prefix="/v1/fine_tuning", dependencies=[Depends(current_tenant)])
SUFFIX = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_SEED = 2147483647


async def _json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise APIError(400, "The request body must be a JSON object.", "invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", "invalid_json")
    return body


def _hyperparameters(body: dict) -> tuple[str, dict]:
    """(method type, its hyperparameters) from `method` or the deprecated top-level `hyperparameters`."""
    method = body.get("method")
    if method is None:
        kind, hyper = "supervised", body.get("hyperparameters") or {}
    else:
        kind = method.get("type") if isinstance(method, dict) else None
        if kind not in core.METHOD_TYPES:
            raise APIError(400, f"method.type must be one of {', '.join(core.METHOD_TYPES)}, got {kind!r}.",
                           "invalid_value", "method.type")  # fmt: skip
        hyper = (method.get(kind) or {}).get("hyperparameters") or {}
    if not isinstance(hyper, dict):
        raise APIError(400, "hyperparameters must be an object.", "invalid_value", "hyperparameters")
    return kind, hyper


def _settings(kind: str, hyper: dict) -> dict:
    try:
        return core.settings_from_hyperparameters(hyper, kind)
    except core.SettingsError as exc:
        raise APIError(400, str(exc), "invalid_hyperparameters", f"hyperparameters.{exc.param}") from None


def _model_location(request: Request, model: Any) -> str:
    models = settings_of(request).models
    if not isinstance(model, str) or model not in models:
        names = ", ".join(sorted(models)) or "none registered"
        raise APIError(400, f"Model {model!r} is not available on this server (available: {names}).",
                       "model_not_available", "model")  # fmt: skip
    return models[model]


def _owned_file(request: Request, tenant: str, file_id: Any, param: str) -> dict:
    row = store_of(request).get_file(tenant, file_id) if isinstance(file_id, str) else None
    if row is None:  # another tenant's file reads exactly like a missing one
        raise APIError(400, f"Could not find file {file_id!r}.", f"invalid_{param}", param)
    return row


@router.post("/jobs")
async def create_job(request: Request, tenant: str = Depends(current_tenant)) -> dict:
    body = await _json_body(request)
    location = _model_location(request, body.get("model"))
    training = _owned_file(request, tenant, body.get("training_file"), "training_file")
    validation = body.get("validation_file")
    if validation is not None:
        _owned_file(request, tenant, validation, "validation_file")
    suffix = body.get("suffix")
    if suffix is not None and (not isinstance(suffix, str) or not SUFFIX.match(suffix)):
        raise APIError(400, "suffix must be 1-64 letters, digits, '.', '_' or '-'.", "invalid_value", "suffix")
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(MAX_SEED)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise APIError(400, f"seed must be a whole number from 0 to {MAX_SEED}.", "invalid_value", "seed")
    metadata = body.get("metadata")
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in metadata.items()
        )  # fmt: skip
    ):
        raise APIError(400, "metadata must be at most 16 string pairs (keys <= 64, values <= 512 chars).",
                       "invalid_value", "metadata")  # fmt: skip
    kind, hyper = _hyperparameters(body)
    run_settings = _settings(kind, hyper)
    run_settings |= run_settings_for(body.get("integrations"))  # report_to and its options (integrations.py)
    price = settings_of(request).price_per_million_tokens
    if price is not None:
        run_settings["price_per_million_tokens"] = price
    row = store_of(request).create_job(
        tenant,
        {
            "model": body["model"],
            "model_location": location,
            "training_file": training["id"],
            "validation_file": validation,
            "suffix": suffix,
            "seed": seed,
            "metadata": metadata,
            "method": {"type": kind, kind: {"hyperparameters": hyper}},
            "run_settings": run_settings,
            "lr_multiplier": None,  # inside run_settings now (lr_multiplier); the column stays for old rows
        },
    )
    return job_object(row)


def _metadata_filter(request: Request) -> dict[str, str]:
    found = {}
    for key, value in request.query_params.multi_items():
        if key.startswith("metadata[") and key.endswith("]"):
            found[key[len("metadata[") : -1]] = value
    return found


@router.get("/jobs")
def list_jobs(
    request: Request, tenant: str = Depends(current_tenant), after: str | None = None, limit: int = 20
) -> dict:
    page = store_of(request).list_jobs(tenant, after, check_limit(limit), _metadata_filter(request))
    return page_object(page, job_object)


def _job(request: Request, tenant: str, job_id: str) -> dict:
    row = store_of(request).get_job(tenant, job_id)
    if row is None:
        raise not_found("fine-tuning job", job_id, "fine_tuning_job_id")
    return row


@router.get("/jobs/{job_id}")
def retrieve_job(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    return job_object(_job(request, tenant, job_id))


def _transition(request: Request, tenant: str, job_id: str, action: str) -> dict:
    try:
        row = store_of(request).transition(tenant, job_id, action)
    except IllegalTransition as exc:
        raise APIError(400, f"Cannot {action} fine-tuning job {job_id}: it is {exc.status}.",
                       "invalid_state", "fine_tuning_job_id") from None  # fmt: skip
    if row is None:
        raise not_found("fine-tuning job", job_id, "fine_tuning_job_id")
    return job_object(row)


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    return _transition(request, tenant, job_id, "cancel")


@router.post("/jobs/{job_id}/pause")
def pause_job(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    return _transition(request, tenant, job_id, "pause")


@router.post("/jobs/{job_id}/resume")
def resume_job(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    return _transition(request, tenant, job_id, "resume")


@router.get("/jobs/{job_id}/events")
def list_events(
    job_id: str, request: Request, tenant: str = Depends(current_tenant), after: str | None = None, limit: int = 20
) -> dict:
    page = store_of(request).list_events(tenant, job_id, after, check_limit(limit))
    if page is None:
        raise not_found("fine-tuning job", job_id, "fine_tuning_job_id")
    return page_object(page, event_object)


@router.get("/jobs/{job_id}/checkpoints")
def list_checkpoints(
    job_id: str, request: Request, tenant: str = Depends(current_tenant), after: str | None = None, limit: int = 10
) -> dict:
    job = _job(request, tenant, job_id)
    page = store_of(request).list_checkpoints(tenant, job_id, after, check_limit(limit))
    if page is None:
        raise not_found("fine-tuning job", job_id, "fine_tuning_job_id")
    return page_object(page, lambda row: checkpoint_object(row, job))


@router.get("/jobs/{job_id}/metrics")
def job_metrics(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    """Our addition: the run's metrics.jsonl lines (one per optimizer step), oldest first."""
    job = _job(request, tenant, job_id)
    rows = core.read_metrics(settings_of(request).runs_dir / job["id"])
    return {"object": "list", "data": rows, "has_more": False}


@router.post("/plan")
async def plan(request: Request, tenant: str = Depends(current_tenant)) -> dict:
    """Our addition: the plan for a file and settings (the same as `finetune plan --json`), no job created."""
    body = await _json_body(request)
    location = _model_location(request, body.get("model"))
    training = _owned_file(request, tenant, body.get("training_file"), "training_file")
    validation = body.get("validation_file")
    validation_row = _owned_file(request, tenant, validation, "validation_file") if validation is not None else None
    kind, hyper = _hyperparameters(body)
    run_settings = _settings(kind, hyper)
    files_dir = settings_of(request).files_dir
    data = files_dir / training["id"]
    seed = body.get("seed") if isinstance(body.get("seed"), int) else 0
    config = core.run_config(
        run_settings, str(data), location, seed, str(files_dir / validation) if validation else None
    )
    try:
        plan = (await run_in_threadpool(core.plan_job, config)).plan
    except UserError as exc:
        val_name = validation_row["filename"] if validation_row else None
        error = core.planning_error(
            exc, config, data, training["filename"], files_dir / validation if validation else None, val_name
        )
        raise APIError(400, error["message"], error["code"], error["param"]) from None
    files = {data: training["filename"]} | ({files_dir / validation: validation_row["filename"]} if validation else {})
    answer = core.plan_answer(plan, body["model"], files)
    return {"object": "fine_tuning.plan", "training_file": training["id"], **answer}


def usage_of(store, tenant: str) -> dict:
    rows = []
    for job in store.all_jobs(tenant):
        report = job["report"] or {}
        rows.append({
            "job_id": job["id"], "model": job["model"], "status": job["status"],
            "fine_tuned_model": job["fine_tuned_model"], "trained_tokens": job["trained_tokens"],
            "cost": report.get("cost"), "currency": report.get("currency"),
        })  # fmt: skip
    costs = [r["cost"] for r in rows if r["cost"] is not None]
    return {
        "object": "usage",
        "tenant": tenant,
        "data": rows,
        "total_trained_tokens": sum(r["trained_tokens"] or 0 for r in rows),
        "total_cost": sum(costs) if costs else None,
    }


usage_router = APIRouter(prefix="/v1", dependencies=[Depends(current_tenant)])


@usage_router.get("/usage")
def usage(request: Request, tenant: str = Depends(current_tenant)) -> dict:
    """Our addition: trained tokens and cost per job and in total, for the caller's tenant."""
    return usage_of(store_of(request), tenant)
