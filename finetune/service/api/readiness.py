"""GET /readyz: can this server do its work now? (GET /healthz only says it is up.)

    database     a query answers
    migrations   the schema is at the newest step this code knows (db.SCHEMA_VERSION)
    storage      the data folder and the folders under it the API writes (files, uploads, runs) take a new file

200 {"status": "ready", "checks": {...}} when all pass; 503 {"status": "not_ready", "failing": [...], "checks":
{...}} otherwise, each check {"ok": bool} with what went wrong. No answer names a path on the server.

A job whose trainer waits for resources (a Ray cluster's devices) is said in "waiting" (each: its sentence and for
how long) and "warnings", and is no failure: a 503 would take the API out of its load balancer, and with it the way
to cancel that job. Neither names the job nor its tenant.
"""

from __future__ import annotations

import os
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import select, text

from finetune.service.api.deps import options_of, store_of
from finetune.service.storage.db import SCHEMA_VERSION, schema_version, transaction

router = APIRouter()


def _database(store) -> dict:
    try:
        with transaction(store.engine) as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        return {"ok": False, "error": f"the database does not answer: {type(exc).__name__}"}
    return {"ok": True}


def _migrations(store) -> dict:
    try:
        with transaction(store.engine) as conn:
            found = conn.execute(select(schema_version.c.version)).scalar()
    except Exception as exc:
        return {"ok": False, "error": f"cannot read the schema version: {type(exc).__name__}", "head": SCHEMA_VERSION}
    answer = {"ok": found == SCHEMA_VERSION, "version": found, "head": SCHEMA_VERSION}
    if found != SCHEMA_VERSION:
        answer["error"] = f"the schema is at version {found}, this server needs {SCHEMA_VERSION}"
    return answer


def _storage(options) -> dict:
    folders = {
        "data folder": options.data_dir,
        "files": options.files_dir,
        "uploads": options.uploads_dir,
        "runs": options.runs_dir,
    }
    for name, folder in folders.items():
        probe = folder / f".readyz-{uuid.uuid4().hex}"
        try:
            with open(probe, "xb") as f:
                f.write(b"ok")
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
        except OSError as exc:
            return {"ok": False, "error": f"cannot write in the {name}: {exc.strerror or type(exc).__name__}"}
    return {"ok": True}


def _waiting(store, options) -> dict:
    """What the live workers' jobs wait for (workers.waiting, beaten by each worker)."""
    try:
        live = store.workers.live(options.lease_seconds)
    except Exception:  # the database check says so
        return {}
    t = int(time.time())
    waiting = [{"message": w["waiting"]["message"], "seconds": t - w["waiting"]["since"]} for w in live if w["waiting"]]
    if not waiting:
        return {}
    return {"waiting": waiting, "warnings": [f"a job has waited {w['seconds']} s: {w['message']}" for w in waiting]}


@router.get("/readyz", include_in_schema=False)
def readyz(request: Request) -> JSONResponse:
    store, options = store_of(request), options_of(request)
    checks = {"database": _database(store), "migrations": _migrations(store), "storage": _storage(options)}
    failing = [name for name, check in checks.items() if not check["ok"]]
    if failing:
        return JSONResponse({"status": "not_ready", "failing": failing, "checks": checks}, status_code=503)
    return JSONResponse({"status": "ready", "checks": checks, **_waiting(store, options)})
