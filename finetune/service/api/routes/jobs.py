"""/v1/fine_tuning: jobs (create, list, retrieve, cancel, pause, resume, events, checkpoints, metrics) and
our POST /v1/fine_tuning/plan. Creating a job only records it (status queued, until a worker claims it); the
worker validates, plans and trains it. Bodies are protocol.JobCreate; an Idempotency-Key makes a create
idempotent (idempotency.py)."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from finetune.service.api.auth import current_tenant
from finetune.service.api.deps import check_limit, options_of, store_of
from finetune.service.api.idempotency import digest_json, once
from finetune.service.api.integrations import run_settings_for
from finetune.service.api.objects import checkpoint_object, event_object, job_object, page_object
from finetune.service.api.openai_errors import not_found
from finetune.service.api.protocol import MAX_SEED, BodyError, JobCreate, openapi_body, parse_body
from finetune.service.api.routes.files import find_file
from finetune.service.api_error import APIError
from finetune.service.storage import quotas, run_folders
from finetune.service.storage.store import IllegalTransition, Page
from finetune.service.storage.tombstones import files_still_there
from finetune.service.storage.usage import prices_of
from finetune.service.workers import library as core
from finetune.service.workers.pool import pool_for
from finetune.settings.errors import UserError
from finetune.settings.registry import setting

router = APIRouter(prefix="/v1/fine_tuning", dependencies=[Depends(current_tenant)])
RESULTS_PURPOSE = "fine-tune-results"  # what a job writes (step_metrics.csv), never what one trains on
# a body that does not fit protocol.JobCreate: (code, message) by OpenAI parameter, as the API has always said them
BODY_ERRORS = {
    "suffix": ("invalid_value", "suffix must be 1-64 letters, digits, '.', '_' or '-'."),
    "seed": ("invalid_value", f"seed must be a whole number from 0 to {MAX_SEED}."),
    "metadata": ("invalid_value", "metadata must be at most 16 string pairs (keys <= 64, values <= 512 chars)."),
    "hyperparameters": ("invalid_value", "hyperparameters must be an object."),
}


async def _json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the JSON parser goes
        raise APIError(400, "The request body must be a JSON object.", "invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", "invalid_json")
    return body


def _job_body(request: Request, body: dict) -> JobCreate:
    """The body as protocol.JobCreate, or OpenAI's error for its first parameter at fault."""
    try:
        return parse_body(JobCreate, body)
    except BodyError as exc:
        param = exc.param
    if param == "model":
        _model_location(request, body.get("model"))  # raises: not a registered name
    if param in ("training_file", "validation_file"):
        raise APIError(400, f"Could not find file {body.get(param)!r}.", f"invalid_{param}", param)
    if param == "method.type":
        method = body.get("method")
        kind = method.get("type") if isinstance(method, dict) else None
        raise APIError(400, f"method.type must be one of {', '.join(core.METHOD_TYPES)}, got {kind!r}.",
                       "invalid_value", "method.type")  # fmt: skip
    code, message = BODY_ERRORS.get(param, ("invalid_value", f"{param} is not valid."))
    raise APIError(400, message, code, param)


def _settings(kind: str, hyper: dict) -> dict:
    try:
        return core.settings_from_hyperparameters(hyper, kind)
    except core.SettingsError as exc:
        raise APIError(400, str(exc), "invalid_hyperparameters", f"hyperparameters.{exc.param}") from None


def _model_location(request: Request, model: Any) -> str:
    models = options_of(request).models
    if not isinstance(model, str) or model not in models:
        names = ", ".join(sorted(models)) or "none registered"
        raise APIError(400, f"Model {model!r} is not available on this server (available: {names}).",
                       "model_not_available", "model")  # fmt: skip
    return models[model]


def _training_file(request: Request, tenant: str, file_id: str, param: str) -> dict:
    """The caller's file to train on (or validate with, or replay); a results file is what a job wrote, not data."""
    row = find_file(request, tenant, file_id)
    if row is None:  # another tenant's file reads exactly like a missing one (and a path like any unknown id)
        raise _missing(file_id, param)
    if row["purpose"] == RESULTS_PURPOSE:
        raise APIError(
            400,
            f"File {file_id} ({row['filename']}) is a job's results file (purpose {RESULTS_PURPOSE}), not training "
            "data; upload the conversations with purpose fine-tune.",
            core.error_code(param),
            param,
        )
    return row


def _missing(file_id: str, param: str) -> APIError:
    return APIError(400, f"Could not find file {file_id!r}.", core.error_code(param), param)


def _named_files(request: Request, tenant: str, run_settings: dict) -> dict[str, dict]:
    """The uploads the hyperparameters name by id (general_data), each checked like training_file and taken out of
    `run_settings`: setting -> its file's row. Only the worker puts a path there: the stored upload's."""
    return {
        spec.name: _training_file(request, tenant, run_settings.pop(spec.name), core.file_param(spec))
        for spec in core.file_settings()
        if run_settings.get(spec.name) is not None
    }


@router.post("/jobs", openapi_extra=openapi_body(JobCreate))
async def create_job(request: Request, tenant: str = Depends(current_tenant)) -> dict:
    raw = await _json_body(request)
    body = _job_body(request, raw)

    async def make() -> tuple[str, dict]:
        # in a thread: its monthly-tokens quota may read the file for its estimate
        job = job_object(await run_in_threadpool(_create_job, request, tenant, body, raw.get("integrations")))
        return job["id"], job

    return await once(request, tenant, "POST /v1/fine_tuning/jobs", lambda: digest_json(raw), make)


def _create_job(request: Request, tenant: str, body: JobCreate, integrations: Any) -> dict:
    location = _model_location(request, body.model)
    training = _training_file(request, tenant, body.training_file, "training_file")
    if body.validation_file is not None:
        _training_file(request, tenant, body.validation_file, "validation_file")
    seed = body.seed if body.seed is not None else secrets.randbelow(MAX_SEED)
    kind, hyper = body.method_and_hyperparameters()
    run_settings = _settings(kind, hyper)
    named = _named_files(request, tenant, run_settings)
    run_settings |= run_settings_for(integrations)  # report_to and its options (integrations.py)
    looked_at = [(training["id"], "training_file"), (body.validation_file, "validation_file")]
    looked_at += [(row["id"], core.file_param(setting(name))) for name, row in named.items()]
    still_there = files_still_there(
        tenant, [(file_id, _missing(file_id, param)) for file_id, param in looked_at if file_id]
    )
    return store_of(request).create_job(
        tenant,
        {
            "model": body.model,
            "model_location": location,
            "training_file": training["id"],
            "validation_file": body.validation_file,
            "suffix": body.suffix,
            "seed": seed,
            "metadata": body.metadata,
            "method": {"type": kind, kind: {"hyperparameters": hyper}},
            "run_settings": run_settings,
            "lr_multiplier": None,  # inside run_settings now (lr_multiplier); the column stays for old rows
        }
        | {core.file_column(name): row["id"] for name, row in named.items()},  # general_data_file
        admit=_both(still_there, _quotas(request, tenant, training, run_settings, named.get("general_data"))),
    )


def _both(first: Callable[[Any, dict], None], then: Callable[[Any, dict], None]) -> Callable[[Any, dict], None]:
    """Two checks of store.create_job's `admit`, in the write that adds the job, one after the other."""

    def admit(conn, row: dict) -> None:
        first(conn, row)
        then(conn, row)

    return admit


def _quotas(request: Request, tenant: str, training: dict, run_settings: dict, general: dict | None):
    """The check of the tenant's queued-jobs and monthly-tokens quotas (quotas.py) as the job is added; the job's
    tokens are estimated from its files (the training file, and its general_data: the tenant's own conversations,
    billed too) only when a monthly quota holds."""
    tokens, files_dir = None, options_of(request).files_dir
    if quotas.monthly_limit(store_of(request).engine, tenant) is not None:
        tokens = quotas.file_token_estimate(
            files_dir / training["id"], run_settings, files_dir / general["id"] if general else None
        )
    shown = training["filename"] + (f" and {general['filename']}" if general else "")
    return quotas.admit_job(tenant, tokens, shown)


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


def job_or_404(request: Request, tenant: str, job_id: str) -> dict:
    """The caller's job (another tenant's reads like a missing one): the one lookup of a job id, here and in the
    dashboard's routes."""
    row = store_of(request).get_job(tenant, job_id)
    if row is None:
        raise not_found("fine-tuning job", job_id, "fine_tuning_job_id")
    return row


@router.get("/jobs/{job_id}")
def retrieve_job(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    return job_object(job_or_404(request, tenant, job_id))


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


def checkpoints_page(request: Request, tenant: str, job_id: str, after: str | None, limit: int) -> Page:
    """The job's checkpoint rows, newest first (the list route's, and the dashboard's download's)."""
    page = store_of(request).list_checkpoints(tenant, job_id, after, check_limit(limit))
    if page is None:
        raise not_found("fine-tuning job", job_id, "fine_tuning_job_id")
    return page


@router.get("/jobs/{job_id}/checkpoints")
def list_checkpoints(
    job_id: str, request: Request, tenant: str = Depends(current_tenant), after: str | None = None, limit: int = 10
) -> dict:
    job = job_or_404(request, tenant, job_id)
    page = checkpoints_page(request, tenant, job_id, after, limit)
    return page_object(page, lambda row: checkpoint_object(row, job))


@router.get("/jobs/{job_id}/metrics")
def job_metrics(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    """Our addition: the run's metrics.jsonl lines (one per optimizer step), oldest first."""
    job = job_or_404(request, tenant, job_id)
    rows = run_folders.read_metrics(options_of(request).runs_dir / job["id"])
    return {"object": "list", "data": rows, "has_more": False}


@router.post("/plan", openapi_extra=openapi_body(JobCreate))
async def plan(request: Request, tenant: str = Depends(current_tenant)) -> dict:
    """Our addition: the plan for a file and settings (the same as `finetune plan --json`), no job created.
    Its answer names the model as registered and the files as uploaded: no path on the server."""
    body = _job_body(request, await _json_body(request))
    location = _model_location(request, body.model)
    training = _training_file(request, tenant, body.training_file, "training_file")
    validation = None
    if body.validation_file is not None:
        validation = _training_file(request, tenant, body.validation_file, "validation_file")
    options = options_of(request)
    run_settings = _settings(*body.method_and_hyperparameters())
    named = _named_files(request, tenant, run_settings)
    run_settings["cache_dir"] = str(options.token_cache_dir)  # the service's own (deletion.py)
    run_settings |= prices_of(options)  # costed at this server's prices
    run_settings |= {name: str(options.files_dir / row["id"]) for name, row in named.items()}
    data = options.files_dir / training["id"]
    val = options.files_dir / validation["id"] if validation else None
    config = core.run_config(run_settings, str(data), location, body.seed or 0, str(val) if val else None)
    files = _plan_files(options.files_dir, training, validation, named)
    pool = pool_for(store_of(request), options, config.devices)  # sized for the workers, never assumed
    if pool.device_kind is not None:
        config = dataclasses.replace(config, gpu=pool.device_kind)
    try:
        plan = (await run_in_threadpool(core.plan_job, config, None, pool.speed_of)).plan
    except UserError as exc:
        error = core.planning_error(exc, config, files)
        raise APIError(400, error["message"], error["code"], error["param"]) from None
    uploaded = {path: shown for path, shown, _ in files}
    answer = core.as_uploaded(core.plan_answer(plan, body.model, {}), uploaded)  # `file-<id>:N` -> `name.jsonl:N`
    answer |= {"object": "fine_tuning.plan", "training_file": training["id"]}
    answer |= {setting(name).plan_key: row["id"] for name, row in named.items()}  # as the caller sent it
    if pool.problem:
        answer["warnings"].append({"code": "no_worker_can_run_it", "message": pool.problem, "settings": []})
    shown = {location: body.model} | {str(path): name for path, name in uploaded.items()}
    return without_server_paths(answer, shown, options.data_dir)


def _plan_files(
    files_dir: Path, training: dict, validation: dict | None, named: dict[str, dict]
) -> list[tuple[Path, str, str]]:
    """(stored path, name as uploaded, param) of each file a plan reads: the training file first."""
    rows = [(training, "training_file")] + ([(validation, "validation_file")] if validation else [])
    rows += [(row, core.file_param(setting(name))) for name, row in named.items()]
    return [(files_dir / row["id"], row["filename"], param) for row, param in rows]


def without_server_paths(value: Any, shown: dict[str, str], data_dir: Path) -> Any:
    """`value` with every path the server knows (the model's location, the data files) in the names the caller
    knows (`shown`: path -> name); anything else under the data folder goes too (docs/service.md promises that
    no answer names a path on the server)."""
    if isinstance(value, dict):
        return {k: without_server_paths(v, shown, data_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [without_server_paths(v, shown, data_dir) for v in value]
    if not isinstance(value, str):
        return value
    for path, name in sorted(shown.items(), key=lambda item: -len(item[0])):  # the longest first: no partial
        for form in {path, str(Path(path).resolve())}:
            value = value.replace(form, name)
    for form in {str(data_dir), str(data_dir.resolve())}:
        value = value.replace(form, "<data folder>")
    return value
