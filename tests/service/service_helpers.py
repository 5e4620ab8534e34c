"""Helpers of the job-service tests: a real `finetune serve` on loopback, a fresh PostgreSQL database, settings."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from finetune.service.options import ServiceOptions

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")
FAKE_SERVICE = Path(__file__).resolve().with_name("fake_service.py")  # serve / worker with the stand-in trainer
POSTGRES_ENV = "FINETUNE_TEST_POSTGRES_URL"


def fresh_postgres_database() -> str:
    """A new empty database on the test cluster; its URL."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set (.ci/run starts PostgreSQL and sets it)")
    import psycopg

    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`finetune serve` as a real process on 127.0.0.1."""

    def __init__(
        self, data_dir: Path, model: Path, workers: int = 1, extra: tuple[str, ...] = (), env=None, fake: bool = False
    ):
        """`fake`: its workers run the stand-in trainer (fake_service.py), not `finetune train`."""
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        entry = [sys.executable, str(FAKE_SERVICE)] if fake else [sys.executable, "-m", "finetune"]
        command = [*entry, "serve", "--port", str(self.port), "--data-dir", str(data_dir),
                   "--model", f"toy={model}", "--workers", str(workers), *extra]  # fmt: skip
        self.log_path = data_dir.parent / f"serve-{self.port}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env or os.environ)
        self.key = self._wait_ready()

    def _wait_ready(self) -> str | None:
        import urllib.request

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited: {self.output()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as answer:
                    if answer.status == 200:
                        found = re.search(r"ftk-[\w-]+", self.output())  # a text line, or a JSON log line
                        return found.group(0) if found else None
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"serve did not get ready: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def settings_for(data_dir: Path, model: Path, database: str | None = None, **values) -> ServiceOptions:
    return ServiceOptions(data_dir=data_dir, database=database, models={"toy": str(model)}, **values)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


LOOPBACK = "http://127.0.0.1"  # the address an in-process client calls from (the CSRF check reads it)


def api_client(app, tenant: str = "alice"):
    """An in-process client of `app` (the `app` fixture) with `tenant`'s API key."""
    from fastapi.testclient import TestClient

    client = TestClient(app, base_url=LOOPBACK)
    client.headers["Authorization"] = f"Bearer {app.state.test_keys[tenant]}"
    return client
