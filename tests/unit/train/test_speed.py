"""This machine's training speed: measured once and cached; a finished run's own steps replace the measurement."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from finetune.report.metrics import read_metrics
from finetune.run import train
from finetune.settings.config import RunConfig
from finetune.train import speed

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CPU = torch.device("cpu")


@pytest.fixture
def speed_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "speed.json"


def test_measured_once_then_read_from_the_cache(toy_model, speed_cache, monkeypatch):
    measured = speed.training_speed(str(toy_model), "lora", 100, CPU)
    assert measured > 0 and speed_cache.exists()

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(speed, "_measure", no_measuring)
    assert speed.training_speed(str(toy_model), "lora", 120, CPU) == measured  # 100 and 120: both measure 128
    assert speed.cached_speed(str(toy_model), "full", 100, "cpu") is None  # another method: not known


def test_a_finished_run_replaces_the_measurement_with_its_own_speed(toy_model, speed_cache, tmp_path):
    out = tmp_path / "run"
    config = RunConfig(data=str(EXAMPLES / "train.jsonl"), model=str(toy_model), out=str(out), max_steps=4)
    run = train(config)
    seq_len = run.plan.data.max_record_tokens
    speed.remember_run_speed(str(toy_model), "lora", seq_len, "cpu", 1.0)  # what a busy machine might have cached
    run = train(RunConfig(**{**config.__dict__, "out": str(tmp_path / "again")}))

    steps = [row["tokens_per_s"] for row in read_metrics(tmp_path / "again" / "metrics.jsonl")]
    assert speed.cached_speed(str(toy_model), "lora", seq_len, "cpu") == statistics.median(steps)
    entry = next(iter(json.loads(speed_cache.read_text()).values()))
    assert set(entry) == {"tokens_per_s", "measured_at"}
