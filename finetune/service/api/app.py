"""create_api(options): the API's FastAPI app. Routers live in routes/ (and serving's chat completions in
ship/serving) and are included here; every /v1 route depends on auth.current_tenant. Beside them: /healthz (up),
/readyz (readiness.py), /metrics (prometheus.py). The app `finetune serve` serves adds the dashboard to it
(dashboard/app.py)."""

from __future__ import annotations

import time

from fastapi import FastAPI

from finetune.service.api.audit_http import install_audit
from finetune.service.api.auth import current_tenant
from finetune.service.api.openai_errors import install_error_handlers
from finetune.service.api.prometheus import install_metrics
from finetune.service.api.readiness import router as readiness_router
from finetune.service.api.routes import evaluations, files, job_delete, jobs, models, schema, usage
from finetune.service.api.upload import sweep_uploads
from finetune.service.options import ServiceOptions
from finetune.service.storage.audit_trail import AuditLog
from finetune.service.storage.store import Store

NO_WORKER_WARNING = (
    "no live worker: new jobs wait as queued until one starts (`finetune worker`, or `finetune serve --workers N`)"
)


def create_api(options: ServiceOptions, store: Store | None = None) -> FastAPI:
    options.make_dirs()
    store = store or Store(options.database_url)
    store.migrate()
    sweep_uploads(options.uploads_dir)

    app = FastAPI(title="finetune", docs_url=None, redoc_url=None, openapi_url="/v1/openapi.json")
    app.state.options = options
    app.state.store = store
    app.state.started = int(time.time())
    install_error_handlers(app)
    # GET /metrics, and the HTTP requests it counts; tenant ids in its labels only behind --metrics-token
    install_metrics(app, store, options.lease_seconds, per_tenant=options.metrics_token is not None)
    install_audit(app, AuditLog(store.engine))  # every write and download, one record; GET /v1/audit

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict:
        """Liveness (always 200 once serving), and how many workers are live (a heartbeat within the lease time
        and not stopping): with none, jobs wait `queued`, and a warning says so."""
        live = [w for w in store.workers.live(options.lease_seconds) if not w["draining"]]
        answer: dict = {"status": "ok", "workers": len(live)}
        if not live:
            answer["warnings"] = [NO_WORKER_WARNING]
        return answer

    app.include_router(files.router)
    app.include_router(jobs.router)
    app.include_router(usage.router)
    app.include_router(readiness_router)
    app.include_router(models.router)
    app.include_router(schema.router)
    app.include_router(job_delete.router)  # DELETE /v1/fine_tuning/jobs/{id} (deletion.py)
    app.include_router(evaluations.router)  # a succeeded job's evaluations, run by a worker (workers/evaluation.py)
    # torch: the serving engine (issue 14's POST /v1/chat/completions) loads it, so only a built app does
    from finetune.ship.serving.service import mount_chat_completions

    mount_chat_completions(app, store, options, tenant=current_tenant, max_models=options.max_models)
    return app
