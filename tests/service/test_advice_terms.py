"""Advice speaks to an API caller in its own terms, and the service's estimates are for the devices its workers have:
the official openai SDK (and plain HTTP for our plan route) against a real `finetune serve` with one CPU worker."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from openai import OpenAI
from service_helpers import EXAMPLES, Server

FLAG = "--"  # any command-line flag: never in what an API caller reads
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, toy_model):
    s = Server(tmp_path_factory.mktemp("terms") / "data", toy_model, workers=1, extra=("--heartbeat-seconds", "0.5"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=server.url, api_key=server.key, max_retries=0)


@pytest.fixture(scope="module")
def small_file(client, tmp_path_factory) -> str:
    """24 conversations: a validation split too small to diagnose a run (a warning that names val_fraction)."""
    lines = (EXAMPLES / "train.jsonl").read_text().splitlines(keepends=True)[:24]
    path = tmp_path_factory.mktemp("small") / "small.jsonl"
    path.write_text("".join(lines))
    return client.files.create(file=path.open("rb"), purpose="fine-tune").id


def _plan(server: Server, body: dict) -> dict:
    request = urllib.request.Request(
        f"{server.url}/fine_tuning/plan",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())


def _wait_for_a_worker(server: Server) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as answer:
            if json.loads(answer.read()).get("workers"):
                return
        time.sleep(0.5)
    raise AssertionError("no worker registered: " + server.output())


def test_plan_warnings_name_hyperparameters_not_flags(server, small_file):
    plan = _plan(server, {"model": "toy", "training_file": small_file, "method": {"type": "supervised"}})
    warning = next(w for w in plan["warnings"] if w["code"] == "small_validation_set")
    assert "method.supervised.hyperparameters.val_fraction" in warning["message"]
    assert "validation_file" in warning["message"] and warning["settings"] == ["val_fraction", "val_file"]
    for text in [w["message"] for w in plan["warnings"]] + list(plan["auto"].values()):
        assert FLAG not in text, text


def test_the_estimate_is_for_the_workers_device_never_an_assumed_gpu(server, small_file):
    _wait_for_a_worker(server)
    plan = _plan(server, {"model": "toy", "training_file": small_file})
    assert plan["cost"]["device"] == "cpu" and plan["cost"]["device_assumed"] is False
    assert plan["memory"]["device"] == "cpu"
    assert not any(w["code"] == "no_worker_can_run_it" for w in plan["warnings"])
    busy = _plan(server, {"model": "toy", "training_file": small_file, "hyperparameters": {"devices": 64}})
    assert busy["cost"]["device"] == "cpu"  # the one worker takes any number of CPU processes


def test_a_failed_job_and_its_events_speak_in_api_terms(client, small_file):
    job = client.fine_tuning.jobs.create(
        model="toy",
        training_file=small_file,
        method={"type": "supervised", "supervised": {"hyperparameters": {"grad_accum": 64, "last_batch": "drop"}}},
    )
    deadline = time.monotonic() + 300
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.status == "failed" and job.error.code == "invalid_hyperparameters"
    assert "method.supervised.hyperparameters.last_batch = drop" in job.error.message
    assert FLAG not in job.error.message
    events = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100)]
    assert events and not any(FLAG in message for message in events)
