"""Every model a run loads after training asks for the run's device and precision (plan.json's), proven without a
GPU: CUDA is made to look present, and the one call that moves a loaded model (placement/load.place) is watched and
left on the CPU. The models themselves really are loaded in bf16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from finetune.commands import eval as eval_command
from finetune.placement import load
from finetune.placement.where import Placement
from finetune.ship.eval import retention
from finetune.ship.serving.engine import Engine, GenerationParams, ModelLocation

GPU_BF16 = Placement("cuda", "bf16")


@pytest.fixture
def gpu_run(lora_run, tmp_path, monkeypatch) -> tuple[Path, list]:
    """The shared LoRA run, its plan.json saying it trained on a GPU in bf16; CUDA looks present; every placement
    asked for is recorded (the model stays where it is)."""
    run = Path(shutil.copytree(lora_run, tmp_path / "run"))
    plan = json.loads((run / "plan.json").read_text())
    (run / "plan.json").write_text(json.dumps({**plan, "device": "cuda", "dtype": "bf16"}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    asked = []
    monkeypatch.setattr(load, "place", lambda model, placement: asked.append(placement) or model)
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    return run, asked


def _bf16(model) -> bool:
    return {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_the_retention_check_loads_both_sides_as_the_run_was_placed(gpu_run, monkeypatch):
    run, asked = gpu_run
    monkeypatch.setattr(retention, "MAX_NEW_TOKENS", 2)
    monkeypatch.setattr(retention, "REQUEST_TOKENS", 2)
    seen = []
    real = retention.answers_of
    monkeypatch.setattr(retention, "answers_of", lambda model, *a: seen.append(_bf16(model)) or real(model, *a))
    report = retention.check_retention(run, limit=2)
    assert asked and set(asked) == {GPU_BF16} and seen == [True, True]
    assert report["n"]["answers"] + report["n"]["rules"] == 2
    stages = [json.loads(line) for line in (run / "stages.jsonl").read_text().splitlines()]
    assert [s["stage"] for s in stages][-2:] == ["retention: base", "retention: tuned"]  # after training's


def test_eval_loads_the_base_and_the_tuned_model_as_the_run_was_placed(gpu_run, monkeypatch):
    run, asked = gpu_run
    loaded = []
    real = eval_command.generate_batches
    monkeypatch.setattr(
        eval_command, "generate_batches", lambda model, *a: loaded.append(_bf16(model)) or real(model, *a)
    )
    request = eval_command.EvalRequest(data=str(run), limit=1, max_new_tokens=2)
    eval_command.evaluate(request)
    assert set(asked) == {GPU_BF16} and len(asked) >= 2 and loaded == [True, True]


def test_serving_places_a_base_and_its_adapter_by_the_rule_a_run_would_use(gpu_run, toy_model):
    run, asked = gpu_run
    engine = Engine(max_models=2, default_max_tokens=2)
    assert engine.placement(str(toy_model)) == GPU_BF16  # a GPU computes bf16: Auto's rule, as a run would choose
    location = ModelLocation(str(toy_model), str(run / "adapter"))
    completion = engine.complete(location, [{"role": "user", "content": "hi"}], GenerationParams(temperature=0))
    assert asked == [GPU_BF16] and completion.completion_tokens <= 2
    assert _bf16(engine._bases[str(toy_model)].model)
