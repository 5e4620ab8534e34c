"""Fixtures of the job-service tests: stores on SQLite and PostgreSQL, tiny data files.
PostgreSQL tests need FINETUNE_TEST_POSTGRES_URL (.ci/run starts a cluster and sets it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_helpers import EXAMPLES, fresh_postgres_database, settings_for

from finetune.service.storage.store import Store


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    return fresh_postgres_database()


@pytest.fixture
def store(database_url):
    s = Store(database_url)
    s.migrate()
    yield s
    s.close()


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """16 conversations: a few steps of training."""
    path = tmp_path_factory.mktemp("data") / "tiny.jsonl"
    lines = (EXAMPLES / "train.jsonl").read_text().splitlines()[:16]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def app(tmp_path, toy_model):
    """The job API in this process (no worker running), with an API key each for tenants alice and bob
    (`app.state.test_keys`); `service_helpers.api_client(app, tenant)` calls it as one of them."""
    from finetune.service.dashboard.app import create_app

    app = create_app(settings_for(tmp_path / "data", toy_model))
    app.state.test_keys = {tenant: app.state.store.create_key(tenant)[1] for tenant in ("alice", "bob")}
    yield app
    app.state.store.close()
