"""Fixtures of the job-service tests: stores on SQLite and PostgreSQL, tiny data files.
PostgreSQL tests need FINETUNE_TEST_POSTGRES_URL (.ci/run starts a cluster and sets it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_helpers import EXAMPLES, fresh_postgres_database

from finetune.service.store import Store


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
