"""Preemption: SIGTERM to `finetune train` saves at a step boundary, exits non-zero, and --resume
finishes with weights bit-identical to an uninterrupted run (on the CPU)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FLAGS = ["--epochs", "1", "--batch-size", "8", "--max-seq-len", "512", "--eval-every", "10", "--seed", "5"]
FLAGS += ["--dtype", "fp32"]  # resumed = uninterrupted, checked in fp32 whatever Auto would choose


def _command(model: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "finetune", "train", str(EXAMPLES / "train.jsonl"), "--model", str(model),
            "--out", str(out), *FLAGS, *extra]  # fmt: skip


def _steps_logged(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.exists() else 0


def test_sigterm_then_resume_equals_uninterrupted(toy_model, tmp_path):
    reference = tmp_path / "reference"
    assert subprocess.run(_command(toy_model, reference), capture_output=True).returncode == 0

    cut = tmp_path / "cut"
    process = subprocess.Popen(_command(toy_model, cut), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while _steps_logged(cut) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "--resume" in err and "Traceback" not in err
    stopped_at = _steps_logged(cut)
    assert (cut / "checkpoints" / f"step-{stopped_at:06d}").is_dir()

    resumed = subprocess.run(_command(toy_model, cut, "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr

    expected = load_file(reference / "adapter" / "adapter_model.safetensors")
    got = load_file(cut / "adapter" / "adapter_model.safetensors")
    assert expected.keys() == got.keys()
    assert all(bool((expected[k] == got[k]).all()) for k in expected)
    plan = json.loads((cut / "plan.json").read_text())
    assert _steps_logged(cut) == plan["total_steps"]
    report = json.loads((cut / "report.json").read_text())
    assert report["tokens_processed"] == plan["tokens_processed"]
