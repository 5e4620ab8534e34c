"""Evaluations of a succeeded job (ours): what `finetune eval RUN --retention` does on the command line, started
where the caller is. A worker runs it (workers/evaluation.py); the API process only records it and reads it back.

    POST /v1/fine_tuning/jobs/{job_id}/evaluations            {"retention": true, "test": true} -> an evaluation
    GET  /v1/fine_tuning/jobs/{job_id}/evaluations            newest first (after=, limit=)
    GET  /v1/fine_tuning/jobs/{job_id}/evaluations/{eval_id}  one (poll it until succeeded or failed)

`retention` (default true): the retention check on the general set; `test` (default: whether the run has a test
set): the run's held-out test set answered and scored. Refused (400) for a job that has not succeeded or was
deleted, for `test` on a run without a test set, and while the job has an evaluation not ended; another tenant's job
is a 404. The answer carries `estimate_seconds` (ship/eval/evaluation_estimate.py: an estimate, computed from the
run's plan and the sets' sizes, as `estimate.how` says). An Idempotency-Key makes the POST idempotent.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from finetune.service.api.auth import current_tenant
from finetune.service.api.deps import check_limit, options_of, store_of
from finetune.service.api.idempotency import digest_json, once
from finetune.service.api.objects import list_object
from finetune.service.api.openai_errors import not_found
from finetune.service.api.routes.jobs import job_or_404
from finetune.service.api_error import APIError
from finetune.service.storage.evaluations import Evaluations, refusal
from finetune.service.storage.job_names import method_type
from finetune.settings.wording import ref, render
from finetune.ship.eval.evaluation_estimate import evaluation_estimate
from finetune.ship.eval.test_split import TEST_FILE

router = APIRouter(prefix="/v1/fine_tuning", dependencies=[Depends(current_tenant)])
ROUTE = "POST /v1/fine_tuning/jobs/{job_id}/evaluations"  # Idempotency-Key's route (the job is in the body's digest)
OPTIONS = ("retention", "test")


def evaluation_object(row: dict) -> dict:
    estimate = row["estimate"]
    return {
        "object": "fine_tuning.job.evaluation",
        "id": row["id"],
        "fine_tuning_job_id": row["job_id"],
        "status": row["status"],
        "retention": row["retention"],
        "test": row["test"],
        "estimate_seconds": estimate["seconds"] if estimate else None,
        "estimate": estimate,
        "created_at": row["created_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "attempts": row["attempts"],
        "results": row["results"],
        "error": row["error"],
    }


async def _body(request: Request) -> dict:
    """The JSON object sent, or {} for an empty body (every option has a default)."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the JSON parser goes
        body = None
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", "invalid_json")
    for key, value in body.items():
        if key not in OPTIONS:
            raise APIError(400, f"Unknown parameter {key!r}: an evaluation takes {' and '.join(OPTIONS)}.",
                           "invalid_value", key)  # fmt: skip
        if not isinstance(value, bool):
            raise APIError(400, f"{key} must be true or false, got {value!r}.", "invalid_value", key)
    return body


def asked_for(request: Request, job: dict, body: dict) -> tuple[bool, bool]:
    """(retention, test) of a request: its own values, else the retention check and the test set when there is one;
    400 for a test set the run does not have, or nothing to do."""
    has_test = (options_of(request).runs_dir / job["id"] / TEST_FILE).is_file()
    retention, test = body.get("retention", True), body.get("test", has_test)
    if test and not has_test:
        hint = render(ref("test_fraction"), "api", method_type(job))
        raise APIError(400, f"Job {job['id']} has no test set: its training held out none ({hint} holds one out in a "
                       "new job). Ask for the retention check alone (\"test\": false).", "no_test_set", "test")  # fmt: skip
    if not (retention or test):
        raise APIError(400, "Nothing to evaluate: ask for the retention check, the test set or both.", "invalid_value",
                       "retention")  # fmt: skip
    return retention, test


def estimate_for(request: Request, job: dict, retention: bool, test: bool) -> dict | None:
    return evaluation_estimate(options_of(request).runs_dir / job["id"], retention, test)


def _create(request: Request, tenant: str, job_id: str, body: dict) -> dict:
    job = job_or_404(request, tenant, job_id)
    refused = refusal(job, job_id)  # said before the run folder is read; checked again as the row is added
    if refused is not None:
        raise refused
    retention, test = asked_for(request, job, body)
    estimate = estimate_for(request, job, retention, test)
    return Evaluations(store_of(request).engine).create(tenant, job_id, retention, test, estimate)


@router.post("/jobs/{job_id}/evaluations")
async def create_evaluation(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    body = await _body(request)

    async def make() -> tuple[str, dict]:
        row = await run_in_threadpool(_create, request, tenant, job_id, body)  # reads the general set once
        return row["id"], evaluation_object(row)

    return await once(request, tenant, ROUTE, lambda: digest_json({"job": job_id, "body": body}), make)


@router.get("/jobs/{job_id}/evaluations")
def list_evaluations(
    job_id: str, request: Request, tenant: str = Depends(current_tenant), after: str | None = None, limit: int = 20
) -> dict:
    job_or_404(request, tenant, job_id)
    page = Evaluations(store_of(request).engine).page(tenant, job_id, after, check_limit(limit, 100))
    return list_object([evaluation_object(row) for row in page.rows], page.has_more)


@router.get("/jobs/{job_id}/evaluations/{eval_id}")
def retrieve_evaluation(job_id: str, eval_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    job_or_404(request, tenant, job_id)
    row = Evaluations(store_of(request).engine).get(tenant, eval_id, job_id)
    if row is None:
        raise not_found("evaluation", eval_id, "eval_id")
    return evaluation_object(row)


def latest_evaluation(request: Request, tenant: str, job_id: str) -> dict | None:
    """The job's newest evaluation as the API answers it (the dashboard's run page)."""
    row = Evaluations(store_of(request).engine).latest(tenant, job_id)
    return evaluation_object(row) if row else None
