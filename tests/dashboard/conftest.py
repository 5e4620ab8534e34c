"""A real `finetune serve` on loopback (two workers, the toy model) and Debian's chromium driven by Playwright.

Playwright cannot download its own browser on these machines, so the tests launch the system's chromium
(`apt-get install chromium`; .ci/run does it). Without it they skip, unless FINETUNE_REQUIRE_BROWSER=1
(set by .ci/run), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def _chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _need(reason: str) -> None:
    if os.environ.get("FINETUNE_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _finetune(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "finetune", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


class Service:
    def __init__(self, base: str, data_dir: Path, keys: dict[str, str], process: subprocess.Popen) -> None:
        self.base = base
        self.data_dir = data_dir
        self.keys = keys
        self.process = process


@pytest.fixture(scope="session")
def service(tmp_path_factory, toy_model) -> Service:
    data_dir = tmp_path_factory.mktemp("service")
    keys = {}
    for tenant in ("alice", "bob"):
        out = _finetune("keys", "create", "--tenant", tenant, "--data-dir", str(data_dir), cwd=data_dir)
        keys[tenant] = out.strip().splitlines()[-1].strip()
    port = _free_port()
    log = open(data_dir / "serve.log", "w")  # noqa: SIM115 - closed at teardown
    process = subprocess.Popen(
        [sys.executable, "-m", "finetune", "serve", "--host", "127.0.0.1", "--port", str(port)]
        + ["--data-dir", str(data_dir), "--model", f"toy={toy_model}", "--workers", "2"]
        + ["--price-per-million-tokens", "2", "--gpu-hour-price", "1.5"],  # the Usage page shows costs
        cwd=data_dir,
        # two toy jobs side by side, one thread each, so the comparison's second run does not wait for the first
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # so teardown can stop the server and the worker it started, and nothing else
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            log.close()
            raise RuntimeError("finetune serve did not start:\n" + (data_dir / "serve.log").read_text()[-3000:])
        time.sleep(0.3)
    yield Service(base, data_dir, keys, process)
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    log.close()


@pytest.fixture(scope="session")
def browser():
    executable = _chromium()
    if executable is None:
        _need("no chromium on PATH (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def screenshots() -> Path | None:
    """FINETUNE_DASHBOARD_SCREENSHOTS=docs/images writes the documentation's screenshots along the way."""
    folder = os.environ.get("FINETUNE_DASHBOARD_SCREENSHOTS")
    if not folder:
        return None
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _retention_report(dropped: bool) -> dict:
    """retention.json as `finetune eval RUN --retention` writes it (numbers built by its own functions)."""
    from finetune.ship.eval.retention import measure, remedies, verdict

    base = [True] * 60 + [False] * 40
    report = {
        "base_model": "/srv/models/base",
        "tuned": "/srv/runs/job/adapter",
        "method": "lora",
        "general_set": {"digest": "abc", "prompts": 100, "choices": 40, "limit": None},
        "accuracy": measure(base, [False] * 100 if dropped else base),
        "rule_pass_rate": measure(base[:50], base[:50]),
        "choice_accuracy": measure(base[20:60], base[20:60]),
        "kl": {"mean_per_token": 0.8 if dropped else 0.01, "tokens": 4000, "direction": "KL(tuned || base)"},
        "rows": [{"id": "arithmetic-001", "base": "35", "tuned": "36"}],
        "choices": [],
        "seconds": {"total": 12.0},
    }
    report["flag"], report["flagged"], report["message"] = verdict(report)
    report["remedies"] = remedies("lora") if report["flag"] else []
    return report


@pytest.fixture(scope="session")
def retention_report():
    """retention_report(dropped) -> a retention.json, flagged or not."""
    return _retention_report
