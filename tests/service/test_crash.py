"""Crashes with real processes: kill -9 a worker mid-job (a second worker resumes it, weights equal an
uninterrupted run's), and kill -9 the API mid-upload (no orphan rows or files)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from openai import OpenAI
from safetensors.torch import load_file
from service_helpers import Server, settings_for

from finetune.service.dashboard.app import create_app

HYPER = {"n_epochs": 1, "batch_size": 4, "max_seq_len": 256, "val_fraction": 0, "save_every": 1}


def _worker(data_dir: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "finetune", "worker", "--data-dir", str(data_dir), "--lease-seconds", "3",
               "--heartbeat-seconds", "0.5"]  # fmt: skip
    return subprocess.Popen(command, env=os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def test_kill_9_worker_then_another_worker_finishes_with_identical_weights(tmp_path, toy_model, tiny_data):
    server = Server(tmp_path / "data", toy_model, workers=0)
    first = second = None
    try:
        client = OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
        f = client.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
        job = client.fine_tuning.jobs.create(
            model="toy",
            training_file=f.id,
            seed=3,
            method={"type": "supervised", "supervised": {"hyperparameters": HYPER}},
        )
        run = server.data_dir / "runs" / job.id
        first = _worker(server.data_dir)
        deadline = time.monotonic() + 240
        while len(client.fine_tuning.jobs.checkpoints.list(job.id).data) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(1)
        assert _processes_mentioning(str(run)) == []  # its trainer died with it (no orphan writing on)
        assert client.fine_tuning.jobs.retrieve(job.id).status == "running"  # until the lease runs out

        second = _worker(server.data_dir)
        deadline = time.monotonic() + 300
        while client.fine_tuning.jobs.retrieve(job.id).status == "running" and time.monotonic() < deadline:
            time.sleep(0.3)
        job = client.fine_tuning.jobs.retrieve(job.id)
        assert job.status == "succeeded", job.error
        assert job.attempts == 2
        messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100)]
        assert any("died at step" in m for m in messages) and any(m.startswith("Resuming from step") for m in messages)
    finally:
        for worker in (first, second):
            if worker and worker.poll() is None:
                worker.terminate()
                worker.wait(timeout=60)
        server.stop()

    reference = tmp_path / "reference"  # the same job, uninterrupted, through the library's own command line
    done = subprocess.run([sys.executable, "-m", "finetune", "train", "--plan", str(run.with_suffix(".plan.json")),
                           "--out", str(reference)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected = load_file(reference / "adapter" / "adapter_model.safetensors")
    got = load_file(run / "adapter" / "adapter_model.safetensors")
    assert expected.keys() == got.keys() and all(bool((expected[k] == got[k]).all()) for k in expected)


def test_kill_9_api_mid_upload_leaves_no_orphans(tmp_path, toy_model):
    server = Server(tmp_path / "data", toy_model, workers=0)
    uploads = server.data_dir / "uploads"
    boundary = "b0undary"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="t.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode()  # fmt: skip
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(
            (f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {server.key}\r\n"
             f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: 1000000\r\n\r\n").encode()
            + head + b"x" * 200_000
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not any(p.stat().st_size > 0 for p in uploads.glob("*.part")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(uploads.glob("*.part")), "the upload never reached the disk"
        server.stop(signal.SIGKILL)  # mid-upload: the body is a fifth sent

    restarted = create_app(settings_for(server.data_dir, toy_model))  # what the next `finetune serve` does first
    assert list(uploads.iterdir()) == []
    assert list((server.data_dir / "files").iterdir()) == []
    assert restarted.state.store.list_files("default", None, 100).rows == []
    restarted.state.store.close()
