"""This machine's training speed: measured once and cached; a finished run's own steps replace the measurement; a
first `finetune train` does not measure (one model load), and a process that only plans reads speeds without torch."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from finetune.report.metrics import read_metrics
from finetune.run import plan_run, train
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


def test_a_first_run_loads_its_model_once_and_the_next_plan_reads_its_speed(
    toy_model, speed_cache, tmp_path, monkeypatch
):
    from finetune.train import model as model_module

    loads = []
    real_load = model_module.load_model
    monkeypatch.setattr(model_module, "load_model", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    config = RunConfig(data=str(EXAMPLES / "train.jsonl"), model=str(toy_model), out=str(tmp_path / "run"), max_steps=3)
    run = train(config)
    assert len(loads) == 1  # the run's own: no speed probe loads the model before it
    assert run.plan.cost.tokens_per_s is None  # nothing known yet: the plan's time is the FLOP guess, and says so
    assert any("guess" in note for note in run.plan.cost.notes)

    steps = [row["tokens_per_s"] for row in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    planned = plan_run(RunConfig(**{**config.__dict__, "out": None}), measure=False).plan
    assert planned.cost.tokens_per_s == statistics.median(steps)  # the next plan: what the run did
    assert len(loads) == 1  # planning with measure=False loads no model


def test_a_process_that_only_plans_reads_speeds_without_torch(toy_model, speed_cache):
    speed.remember_run_speed(str(toy_model), "lora", 100, "cpu", 123.0)
    code = f"""
import sys
from finetune.run import plan_run
from finetune.settings.config import RunConfig
from finetune.train.speed import cached_speed, speeds_measured_here

assert cached_speed({str(toy_model)!r}, "lora", 120, "cpu") == 123.0
assert list(speeds_measured_here("cpu").values()) == [123.0]
plan_run(RunConfig(data={str(EXAMPLES / "train.jsonl")!r}, gpu="cpu"), measure=False)
assert "torch" not in sys.modules, "torch was imported"
"""  # no model: transformers' AutoTokenizer imports torch itself when it is installed
    done = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
