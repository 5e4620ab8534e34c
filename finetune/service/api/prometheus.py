"""GET /metrics: the service in Prometheus' text format (prometheus-client), every name `finetune_*`.

Where each number comes from, so that it is right however many processes serve and train:

    from the database, read at each scrape (the workers are other processes, often other machines):
      finetune_jobs{status}                                   jobs by status now
      finetune_job_queue_wait_seconds                         created -> its trainer first started
      finetune_job_run_duration_seconds{status}               first start -> finished, for ended jobs
      finetune_workers_alive, finetune_worker_last_heartbeat_timestamp_seconds{worker}
      finetune_trained_tokens_total{tenant,model}, finetune_device_seconds_total{tenant,model}
    counted by this API process (what only it sees):
      finetune_http_requests_total{method,route,code}, finetune_http_request_duration_seconds{method,route}
      finetune_upload_bytes_total{tenant}

The database histograms and counters are cumulative over every job the database holds, so rate() and
histogram_quantile() work on them; several API processes over one database each report the same totals
(scrape one, or aggregate them with max). `route` is the route's template (/v1/fine_tuning/jobs/{job_id}), never
the path with its ids; the tenant id is the only tenant data in any label. `--metrics-token` puts the endpoint
behind `Authorization: Bearer <token>`, and only then are the `tenant` labels the tenants' ids: without it /metrics
is open, so every tenant-labelled series is summed over all tenants under `tenant="*"` (ALL_TENANTS), and no tenant's
name or usage reaches whoever can reach the port.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from sqlalchemy import and_, case, func, select

from finetune.service.api_error import APIError
from finetune.service.logs import request_fields
from finetune.service.storage.db import jobs, transaction, workers
from finetune.service.storage.store import TERMINAL, TRANSITIONS, Store

STATUSES = sorted({target for _, target in TRANSITIONS.values() if target} | {"queued"})
QUEUE_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
RUN_DURATION_BUCKETS = (10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400, 259200)
ALL_TENANTS = "*"  # the one tenant label of an open /metrics: every tenant's numbers summed
WORKER_SHOWN_S = 86400  # a worker that stopped beating without a goodbye is shown this long, then dropped

router = APIRouter()


class StoreCollector:
    """The numbers the database holds, read at scrape time."""

    def __init__(self, store: Store, lease_seconds: float, per_tenant: bool = False) -> None:
        self.store = store
        self.lease_seconds = lease_seconds
        self.per_tenant = per_tenant

    def collect(self) -> Iterator[Metric]:
        with transaction(self.store.engine) as conn:
            by_status = dict(conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status)).all())
            waits = _histogram_rows(conn, jobs.c.started_at - jobs.c.created_at, [jobs.c.started_at.is_not(None)],
                                    QUEUE_WAIT_BUCKETS)  # fmt: skip
            runs = _histogram_rows(
                conn,
                jobs.c.finished_at - jobs.c.started_at,
                [jobs.c.status.in_(TERMINAL), jobs.c.started_at.is_not(None), jobs.c.finished_at.is_not(None)],
                RUN_DURATION_BUCKETS,
                by=jobs.c.status,
            )
            by = [jobs.c.tenant, jobs.c.model] if self.per_tenant else [jobs.c.model]  # open: summed over tenants
            used = conn.execute(
                select(*by, func.sum(jobs.c.trained_tokens), func.sum(jobs.c.device_seconds))
                .group_by(*by)
                .order_by(*by)
            ).all()
            if not self.per_tenant:
                used = [(ALL_TENANTS, *row) for row in used]
            t = time.time()
            known = conn.execute(
                select(workers.c.name, workers.c.last_heartbeat)
                .where(workers.c.stopped_at.is_(None), workers.c.last_heartbeat >= t - WORKER_SHOWN_S)
                .order_by(workers.c.name)
            ).all()

        gauge = GaugeMetricFamily("finetune_jobs", "Fine-tuning jobs by status, now.", labels=["status"])
        for status in sorted(set(STATUSES) | set(by_status)):
            gauge.add_metric([status], by_status.get(status, 0))
        yield gauge
        yield _histogram("finetune_job_queue_wait_seconds", "From a job's creation to its trainer's first start.",
                         waits, QUEUE_WAIT_BUCKETS, [])  # fmt: skip
        yield _histogram("finetune_job_run_duration_seconds", "From a job's first start to its end, by how it ended.",
                         runs, RUN_DURATION_BUCKETS, ["status"])  # fmt: skip
        tokens = CounterMetricFamily("finetune_trained_tokens", "Billed tokens of succeeded jobs.",
                                     labels=["tenant", "model"])  # fmt: skip
        seconds = CounterMetricFamily("finetune_device_seconds", "Device seconds jobs used (running ones so far).",
                                      labels=["tenant", "model"])  # fmt: skip
        for tenant, model, trained, used_s in used:
            tokens.add_metric([tenant, model], float(trained or 0))
            seconds.add_metric([tenant, model], float(used_s or 0.0))
        yield tokens
        yield seconds
        alive = GaugeMetricFamily("finetune_workers_alive", "Workers that beat within the lease time.")
        alive.add_metric([], sum(1 for _, beat in known if beat >= t - self.lease_seconds))
        yield alive
        beats = GaugeMetricFamily("finetune_worker_last_heartbeat_timestamp_seconds",
                                  "Each worker's last heartbeat (unix seconds).", labels=["worker"])  # fmt: skip
        for name, beat in known:
            beats.add_metric([name], float(beat))
        yield beats


def _histogram_rows(conn, value, where: list, bounds: tuple, by=None) -> dict[tuple, tuple]:
    """{labels: (count, sum, [jobs <= bound for each bound])} in one query."""
    columns = [func.count(), func.sum(value)] + [func.sum(case((value <= b, 1), else_=0)) for b in bounds]
    query = select(*([by] if by is not None else []), *columns).where(and_(*where))
    if by is not None:
        query = query.group_by(by)
    found = {}
    for row in conn.execute(query).all():
        labels = (row[0],) if by is not None else ()
        count, total, *below = row[1:] if by is not None else row
        if count:
            found[labels] = (int(count), float(total or 0), [int(n or 0) for n in below])
    return found


def _histogram(name: str, help_text: str, rows: dict, bounds: tuple, labels: list[str]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text, labels=labels)
    if not labels and not rows:
        rows = {(): (0, 0.0, [0] * len(bounds))}
    for key, (count, total, below) in sorted(rows.items()):
        buckets = [(str(float(b)), n) for b, n in zip(bounds, below, strict=True)] + [("+Inf", count)]
        family.add_metric(list(key), buckets, total)
    return family


class Metrics:
    """This app's registry: the database's numbers and what this process counts."""

    def __init__(self, store: Store, lease_seconds: float, per_tenant: bool = False) -> None:
        self.per_tenant = per_tenant
        """Series labelled by tenant id (only behind --metrics-token); else one `tenant="*"` series, all summed."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(StoreCollector(store, lease_seconds, per_tenant))
        self.requests = Counter("finetune_http_requests", "HTTP requests by route template and status code.",
                                ["method", "route", "code"], registry=self.registry)  # fmt: skip
        self.latency = Histogram("finetune_http_request_duration_seconds", "HTTP request latency.",
                                 ["method", "route"], registry=self.registry)  # fmt: skip
        self.upload_bytes = Counter("finetune_upload_bytes", "Bytes of files uploaded and kept.", ["tenant"],
                                    registry=self.registry)  # fmt: skip

    def uploaded(self, tenant: str, size: int) -> None:
        self.upload_bytes.labels(tenant if self.per_tenant else ALL_TENANTS).inc(size)


def metrics_of(request: Request) -> Metrics:
    return request.app.state.metrics


class HttpMetrics:
    """ASGI middleware: counts each request by its route template and status, times it, and notes the fields
    uvicorn's access line carries in JSON (logs.request_fields)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.mounts: list[str] | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                request_fields.set(self._fields(scope, status["code"]))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = self._route(scope)
            self.metrics.requests.labels(scope["method"], route, str(status["code"])).inc()
            self.metrics.latency.labels(scope["method"], route).observe(time.perf_counter() - started)
            request_fields.set(self._fields(scope, status["code"]))  # a 500 is answered after this, by Starlette

    def _route(self, scope) -> str:
        route = scope.get("route")
        if route is not None and getattr(route, "path", None):
            return route.path
        if self.mounts is None:  # the static files' mount has no route object in the scope
            self.mounts = [r.path for r in scope["app"].routes if type(r).__name__ == "Mount"]
        path = scope["path"]
        return next((f"{m}/{{path}}" for m in self.mounts if path.startswith(m + "/")), "unmatched")

    def _fields(self, scope, code: int) -> dict:
        state = scope.get("state") or {}
        job_id = (scope.get("path_params") or {}).get("job_id")
        fields = {"method": scope["method"], "route": self._route(scope), "status": code}
        return fields | {"tenant": state.get("tenant"), "job_id": job_id}


def install_metrics(app: FastAPI, store: Store, lease_seconds: float, per_tenant: bool = False) -> None:
    app.state.metrics = Metrics(store, lease_seconds, per_tenant)
    app.add_middleware(HttpMetrics, metrics=app.state.metrics)
    app.include_router(router)


@router.get("/metrics", include_in_schema=False)
def scrape(request: Request) -> Response:
    token = request.app.state.options.metrics_token
    if token is not None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), token.encode()):
            raise APIError(401, "GET /metrics needs 'Authorization: Bearer <the server's --metrics-token>'.",
                           "invalid_metrics_token", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    encoder, content_type = choose_encoder(request.headers.get("accept"))
    return Response(encoder(metrics_of(request).registry), media_type=content_type)
