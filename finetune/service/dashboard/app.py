"""create_app(options): the app `finetune serve` serves: the API (api/app.py) with the dashboard's page at `/`,
its static files and its /v1/dashboard routes (routes.py)."""

from __future__ import annotations

from fastapi import FastAPI

from finetune.service.api.app import create_api
from finetune.service.dashboard.routes import mount_dashboard
from finetune.service.options import ServiceOptions
from finetune.service.storage.store import Store


def create_app(options: ServiceOptions, store: Store | None = None) -> FastAPI:
    app = create_api(options, store)
    mount_dashboard(app)
    return app
