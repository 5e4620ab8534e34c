"""The dashboard's own additions to the public API, all under /v1/dashboard and all behind the same key auth
as every other route (the key as a Bearer header or the sign-in cookie), plus the page itself at `/`. They look
jobs, files and checkpoints up through the public routes' own functions (routes/jobs.py, routes/files.py),
never the store: what a tenant may see is decided in one place.

    POST   /v1/dashboard/session                     sign in: {"key"} (JSON or form) -> HttpOnly SameSite cookie
    GET    /v1/dashboard/session                     who is signed in: {"tenant"}
    DELETE /v1/dashboard/session                     sign out (clears the cookie)
    GET    /v1/dashboard/progress?job_id=...         the jobs list's live columns, for many jobs in one call
    GET    /v1/dashboard/jobs/{id}/curve?points=N    down-sampled metrics for the charts
    GET    /v1/dashboard/jobs/{id}/run               the frozen plan (settings + Auto reasons), the report, the
                                                     retention check and the test set's answers when an evaluation
                                                     ran, and the Evaluate button's offer (its estimate, the newest)
    GET    /v1/dashboard/jobs/{id}/download          a zip of the final weights, or ?checkpoint=ID of one checkpoint;
                                                     ?format=gguf[&gguf_type=f16|bf16|f32|q8_0]: one .gguf file instead
    GET    /v1/dashboard/files/{id}/preview          validation problems, counts, histogram, records, split
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import threading
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.background import BackgroundTask

from finetune.data.tokenize import load_tokenizer
from finetune.service.api.auth import COOKIE, check_cookie_origin, current_tenant, from_own_origin, tenant_of_key
from finetune.service.api.deps import options_of
from finetune.service.api.openai_errors import not_found
from finetune.service.api.routes.evaluations import asked_for, estimate_for, latest_evaluation
from finetune.service.api.routes.files import find_file
from finetune.service.api.routes.jobs import checkpoints_page, job_or_404
from finetune.service.api_error import APIError
from finetune.service.dashboard.curve import RunViews
from finetune.service.dashboard.preview import FilePreview, PreferencePreview, make_preview
from finetune.service.storage import bucket_copy
from finetune.service.storage.deletion import FILE_FORGETTERS
from finetune.service.storage.evaluations import refusal
from finetune.settings.config import AUTO
from finetune.settings.errors import UserError
from finetune.ship.export.gguf import gguf_of_run, gguf_problem

STATIC = Path(__file__).parent / "static"
# What in a checkpoint only resumes training (train/checkpoint.py STATE_FILES); a download carries the weights.
TRAINING_STATE = {"training_state", "optimizer.pt", "rng.pt", "state.json", "manifest.json"}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)

session_router = APIRouter(prefix="/v1/dashboard")
router = APIRouter(prefix="/v1/dashboard", dependencies=[Depends(current_tenant)])
_views = RunViews()


def run_folder(request: Request, job_id: str) -> Path:
    return bucket_copy.pull_run(options_of(request), job_id)  # --storage: the bucket's log, plan, report


# ------------------------------------------------------------------------------------------------- session


def _same_origin(request: Request) -> bool:
    """A sign-in form posted from another site would sign the browser in to the attacker's tenant. Browsers send
    Origin on every cross-site POST; a request without one (curl, the SDK) is not a browser's."""
    return request.headers.get("origin") is None or from_own_origin(request)


@session_router.post("/session")
async def sign_in(request: Request) -> Response:
    is_form = not request.headers.get("content-type", "").startswith("application/json")
    try:
        body = await request.form() if is_form else await request.json()
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the JSON parser goes
        body = {}
    key = body.get("key") if hasattr(body, "get") else None
    if not _same_origin(request):
        raise APIError(403, "Sign-in must come from the dashboard's own page.", "cross_origin")
    tenant = tenant_of_key(request, key.strip()) if isinstance(key, str) else None
    if tenant is None:
        if is_form:
            return RedirectResponse("/#/login", status_code=303)
        raise APIError(401, "Missing or invalid API key.", "invalid_api_key")
    response: Response = (
        RedirectResponse("/#/jobs", status_code=303)
        if is_form
        else JSONResponse({"object": "dashboard.session", "tenant": tenant})
    )
    response.set_cookie(
        COOKIE,
        key.strip(),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@session_router.delete("/session")
def sign_out(request: Request) -> Response:
    check_cookie_origin(request)  # 403 from another origin, as every other action signed by the cookie
    response = JSONResponse({"object": "dashboard.session", "deleted": True})
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.get("/session")
def whoami(tenant: str = Depends(current_tenant)) -> dict:
    return {"object": "dashboard.session", "tenant": tenant}


# ------------------------------------------------------------------------------------------------- runs


@router.get("/progress")
def progress(
    request: Request, tenant: str = Depends(current_tenant), job_id: Annotated[list[str] | None, Query()] = None
) -> dict:
    data = {}
    for wanted in dict.fromkeys((job_id or [])[:500]):
        try:
            job = job_or_404(request, tenant, wanted)
        except APIError:  # another tenant's, or gone: not in the answer
            continue
        data[job["id"]] = _views.get(run_folder(request, job["id"])).progress()
    return {"object": "dashboard.progress", "data": data}


@router.get("/jobs/{job_id}/curve")
def curve(
    job_id: str, request: Request, tenant: str = Depends(current_tenant), points: int = Query(800, ge=10, le=5000)
) -> dict:
    job_or_404(request, tenant, job_id)
    return _views.get(run_folder(request, job_id)).curve(points)


@router.get("/jobs/{job_id}/run")
def run_details(job_id: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    job = job_or_404(request, tenant, job_id)
    view = _views.get(run_folder(request, job_id))
    report = view.report()
    if report:  # server paths are nobody's business
        report = {k: v for k, v in report.items() if k not in ("out_dir", "final_weights")}
    retention = view.retention()
    if retention:  # the numbers and the verdict; not every answer, nor server paths
        from finetune.ship.eval.retention import summary

        retention = summary(retention)
    return {
        "object": "dashboard.run",
        "plan": view.plan(),
        "report": report,
        "retention": retention,
        "gguf": _gguf_offer(run_folder(request, job_id)),
        "evaluation": _evaluation_offer(request, tenant, job),
        "test_answers": _test_answers(run_folder(request, job_id)),
    }


def _evaluation_offer(request: Request, tenant: str, job: dict) -> dict | None:
    """The Evaluate button's: what it would run (the retention check, and the test set when the run has one) with its
    time estimate, whether it can run now, and the job's newest evaluation (routes/evaluations.py)."""
    latest = latest_evaluation(request, tenant, job["id"])
    refused = refusal(job, job["id"])
    if refused is not None:
        return {"available": False, "reason": refused.message, "latest": latest}
    retention, test = asked_for(request, job, {})
    estimate = estimate_for(request, job, retention, test)
    return {"available": True, "retention": retention, "test": test, "estimate": estimate, "latest": latest}


def _test_answers(run: Path) -> dict | None:
    """eval.json's scores and its best and worst answers beside the references (`finetune eval`, or an evaluation):
    the tenant's own test set and its models' answers; None until an evaluation of the test set ran."""
    stamp = _stamp(run / "eval.json")
    return _test_answers_cached(str(run / "eval.json"), stamp) if stamp else None


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_mtime_ns, found.st_size


# a deleted file's test split and answers go from memory too (deletion.py removes eval.json from its jobs' folders)
FILE_FORGETTERS.append(lambda _file_id: _test_answers_cached.cache_clear())


@functools.lru_cache(maxsize=64)
def _test_answers_cached(path: str, stamp: tuple[int, int]) -> dict | None:
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = ("examples", "summary", "win_rate", "val_loss", "best", "worst")
    return {k: found[k] for k in keys if k in found}


def _gguf_offer(run: Path) -> dict:
    plan = run / "plan.json"
    return dict(_gguf_offer_cached(str(run), plan.stat().st_mtime_ns if plan.exists() else 0))


@functools.lru_cache(maxsize=256)
def _gguf_offer_cached(run: str, plan_stamp: int) -> dict:
    """Whether the run's model can be downloaded as GGUF: read once per plan, not on every poll of the page
    (a real model's tokenizer.json is megabytes)."""
    problem = gguf_problem(Path(run))
    return {"supported": problem is None, "reason": problem}


def _weights_folder(request: Request, tenant: str, job_id: str, checkpoint: str | None) -> tuple[Path, str, int | None]:
    """(folder, download name, checkpoint step or None for the final weights)."""
    job = job_or_404(request, tenant, job_id)
    run = run_folder(request, job_id)
    if checkpoint is None:
        bucket_copy.pull_weights(options_of(request), job_id)  # --storage: fetched once to this machine
        for name in ("adapter", "model"):
            if (run / name).is_dir():
                return run / name, f"{job_id}-{name}", None
        raise APIError(400, f"Job {job_id} has no final weights yet (status {job['status']}).", "not_ready", "job")
    page = checkpoints_page(request, tenant, job_id, None, 10_000)
    step = next((row["step"] for row in page.rows if row["id"] == checkpoint), None)
    folder = run / "checkpoints" / f"step-{step:06d}" if step is not None else None
    if folder is not None:
        bucket_copy.pull_weights(options_of(request), job_id, f"checkpoints/{folder.name}")  # --storage
    if folder is None or not folder.is_dir():
        raise not_found("checkpoint", checkpoint, "checkpoint")
    return folder, f"{job_id}-step-{step}", step


def _zip(folder: Path) -> str:
    handle, path = tempfile.mkstemp(suffix=".zip")
    os.close(handle)
    # stored, not deflated: safetensors barely compress, and stored is as fast as a copy
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for file in sorted(folder.rglob("*")):
            inside = file.relative_to(folder).parts
            if file.is_file() and not TRAINING_STATE & set(inside):
                archive.write(file, file.relative_to(folder).as_posix())
    return path


# one conversion at a time: each holds a whole model in memory while it merges
_gguf_lock = threading.Lock()


def _gguf(run: Path, step: int | None, gguf_type: str) -> Path:
    """The run's weights as GGUF, converted on the first request and kept in the run folder for the next ones."""
    target = run / "gguf" / f"{'final' if step is None else f'step-{step:06d}'}-{gguf_type}.gguf"
    with _gguf_lock:
        if not target.is_file():
            target.parent.mkdir(exist_ok=True)
            gguf_of_run(run, step, target, gguf_type)
    return target


@router.get("/jobs/{job_id}/download")
def download(
    job_id: str,
    request: Request,
    tenant: str = Depends(current_tenant),
    checkpoint: str | None = None,
    format: str = Query("zip", pattern="^(zip|gguf)$"),
    gguf_type: str = Query("f16", pattern="^(f16|bf16|f32|q8_0)$"),
) -> FileResponse:
    folder, name, step = _weights_folder(request, tenant, job_id, checkpoint)
    if format == "gguf":
        run = run_folder(request, job_id)
        problem = _gguf_offer(run)["reason"]
        if problem:
            raise APIError(400, problem, "gguf_not_supported", "format")
        try:
            path = _gguf(run, step, gguf_type)
        except UserError as exc:  # said with the job's id, not the server's folders
            raise APIError(400, str(exc).replace(str(run), job_id), "gguf_not_supported", "format") from None
        bucket_copy.push(options_of(request), path)  # --storage: a GGUF made once, kept with the run
        gguf_name = f"{job_id}.gguf" if step is None else f"{job_id}-step-{step}.gguf"
        return FileResponse(path, media_type="application/octet-stream", filename=gguf_name)
    path = _zip(folder)
    return FileResponse(
        path, media_type="application/zip", filename=f"{name}.zip", background=BackgroundTask(os.unlink, path)
    )


# ------------------------------------------------------------------------------------------------- files


@functools.lru_cache(maxsize=4)
def _tokenizer(location: str):
    return load_tokenizer(location)


class _PreviewCache:
    """The last few previews: paging through records must not re-tokenize the whole file."""

    def __init__(self, size: int = 8) -> None:
        self._items: OrderedDict[tuple, FilePreview | PreferencePreview] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, key: tuple, make) -> FilePreview | PreferencePreview:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value

    def forget(self, file_id: str) -> None:
        """A deleted file's previews (its records) go from memory too (deletion.py)."""
        with self._lock:
            for key in [key for key in self._items if key[0] == file_id]:
                del self._items[key]


_previews = _PreviewCache()
FILE_FORGETTERS.append(_previews.forget)


def _fraction(text: str) -> float | str:
    if text == AUTO:
        return AUTO
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise APIError(400, f"val_fraction must be 'auto' or a number in [0, 1), got {text!r}.", "invalid_value")
    return value


@router.get("/files/{file_id}/preview")
def preview(
    file_id: str,
    request: Request,
    tenant: str = Depends(current_tenant),
    model: str = "",
    max_seq_len: int = Query(1024, ge=1, le=1_048_576),
    record_policy: str = Query("all", pattern="^(all|last|each)$"),
    val_fraction: str = AUTO,
    seed: int = Query(0, ge=0),
    offset: int = Query(0, ge=0),
    limit: int = Query(10, ge=1, le=100),
) -> dict:
    row = find_file(request, tenant, file_id)
    if row is None:
        raise not_found("file", file_id, "file_id")
    options = options_of(request)
    location = None
    if model:
        location = options.models.get(model)
        if location is None:
            raise APIError(
                400, f"Unknown model {model!r}: GET /v1/models lists the ones you can use.", "invalid_value", "model"
            )
    path = bucket_copy.pull(options, options.files_dir / file_id)  # --storage: uploaded on another machine
    fraction = _fraction(val_fraction)
    key = (file_id, row["bytes"], row["created_at"], location, max_seq_len, record_policy, fraction, seed)

    def make() -> FilePreview | PreferencePreview:
        tokenizer = _tokenizer(location) if location else None
        return make_preview(str(path), tokenizer, max_seq_len, record_policy, fraction, seed)

    try:
        result = _previews.get(key, make).page(offset, limit)
    except UserError as exc:
        message = str(exc).replace(str(path), row["filename"])
        raise APIError(400, message, "invalid_file", "file_id") from None
    result["file"] = {"id": file_id, "filename": row["filename"], "bytes": row["bytes"]}
    return result


# ------------------------------------------------------------------------------------------------- mount


def mount_dashboard(app: FastAPI) -> None:
    """The routes above, the static assets and the page at `/`."""
    app.include_router(session_router)
    app.include_router(router)
    app.mount("/dashboard/static", StaticFiles(directory=STATIC), name="dashboard-static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(
            STATIC / "index.html",
            headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
        )
