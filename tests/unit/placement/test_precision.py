"""The run's precision: chosen once by the plan (Auto with its reason, or --dtype), recorded in plan.json, followed by
the memory estimate; a LoRA run's frozen base held in it, every trained weight and AdamW's moments in fp32."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from finetune.data.types import DataSummary
from finetune.models.facts import load_model_facts
from finetune.placement.where import Placement, of_plan
from finetune.plan.build import build_plan
from finetune.plan.plan import Plan
from finetune.rules import precision
from finetune.rules.precision import auto_dtype
from finetune.run import plan_run
from finetune.settings.config import RunConfig
from finetune.train.loop import build_optimizer
from finetune.train.model import model_for
from finetune.train.objective import TokenNormalisedSFT

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
QWEN_05B = load_model_facts("Qwen/Qwen2.5-0.5B")  # 896 wide
DATA = DataSummary(examples=800, validation_examples=80, conversations=800, validation_conversations=80,
                   messages=2_400, tokens_in_file=400_000, max_record_tokens=900)  # fmt: skip


@pytest.mark.parametrize(
    ("device", "width", "cpu_bf16", "chosen"),
    [
        ("h100-80gb", None, False, "bf16"),  # a GPU: bf16 whatever the CPU
        ("cpu", 576, True, "bf16"),  # SmolLM2's width on a CPU with bf16 instructions: measured 1.6x
        ("cpu", 576, False, "fp32"),  # no bf16 instructions: fp32
        ("cpu", 128, True, "fp32"),  # the toy's width: bf16 measured no faster
        ("cpu", 256, True, "bf16"),  # 1.27x
        ("cpu", None, True, "fp32"),  # width unknown
    ],
)
def test_auto_picks_bf16_where_it_was_measured_faster(device, width, cpu_bf16, chosen):
    choice = auto_dtype(device, width, cpu_bf16)
    assert choice.value == chosen and choice.reason


@pytest.mark.parametrize("cpu_bf16", [True, False])
def test_the_plan_records_its_device_and_precision_and_sizes_memory_by_them(monkeypatch, cpu_bf16):
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: cpu_bf16)
    plan = build_plan(RunConfig(gpu="cpu"), DATA, QWEN_05B)
    dtype = "bf16" if cpu_bf16 else "fp32"
    assert (plan.dtype, plan.device) == (dtype, "cpu") and "dtype" in plan.auto
    document = plan.to_dict()
    assert (document["dtype"], document["device"]) == (dtype, "cpu")
    assert of_plan(Plan.from_dict(document)) == Placement("cpu", dtype)
    memory = plan.memory
    frozen = memory.parameters * (2 if cpu_bf16 else 4)  # the frozen base in the run's precision
    assert memory.compute_dtype == dtype and memory.weights == frozen + memory.trainable_parameters * 4
    assert memory.optimizer == memory.trainable_parameters * 8  # AdamW's moments: fp32 either way


def test_dtype_given_decides_and_a_gpu_plan_places_on_cuda(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: True)
    given = build_plan(RunConfig(gpu="cpu", dtype="fp32"), DATA, QWEN_05B)
    assert given.dtype == "fp32" and "dtype" not in given.auto
    gpu = build_plan(RunConfig(gpu="h100"), DATA, QWEN_05B)
    assert (gpu.dtype, gpu.device) == ("bf16", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the code asks for the plan's device
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert of_plan(gpu) == Placement("cuda", "bf16")
    assert of_plan(gpu, torch.device("cuda", 1)) == Placement("cuda:1", "bf16")  # a rank's own device


def test_a_gpu_plan_on_a_machine_without_one_runs_on_the_cpu_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu = build_plan(RunConfig(gpu="h100"), DATA, QWEN_05B)
    assert of_plan(gpu) == Placement("cpu", "bf16") and "no GPU" in caplog.text


def test_lora_holds_the_frozen_base_in_bf16_and_trains_fp32_weights_with_fp32_moments(toy_model, tmp_path):
    """--dtype bf16 on the toy with its output layer trained beside the adapter: the base's matrices in bf16 (half
    the bytes), every trained weight and both AdamW moments in fp32, one step taken under autocast."""
    config = RunConfig(data=str(EXAMPLES / "train.jsonl"), model=str(toy_model), out=str(tmp_path / "run"),
                       dtype="bf16", lora_train_head=True, max_steps=1, replay="off", general_val=False)  # fmt: skip
    planned = plan_run(config, measure=False)
    plan = replace(planned.plan)
    model = model_for(plan, torch.device("cpu"), len(planned.tokenizer))
    trained = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad and p.ndim == 2]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    optimizer = build_optimizer(model, 1e-3, 0.0, fused=True)
    objective = TokenNormalisedSFT()
    batch = objective.batch(list(planned.prepared.train)[:4], plan, planned.tokenizer.pad_token_id or 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = objective.loss(model, batch)
    (loss / batch.num_targets).backward()
    optimizer.step()
    moments = [state[key] for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    assert len(moments) == 2 * len(trained) and all(m.dtype == torch.float32 for m in moments)
    assert torch.isfinite(loss)


def test_full_fine_tuning_keeps_fp32_master_weights_in_bf16(toy_model, tmp_path):
    config = RunConfig(data=str(EXAMPLES / "train.jsonl"), model=str(toy_model), out=str(tmp_path / "run"),
                       dtype="bf16", method="full", max_steps=1, replay="off", general_val=False)  # fmt: skip
    planned = plan_run(config, measure=False)
    model = model_for(planned.plan, torch.device("cpu"), len(planned.tokenizer))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert of_plan(planned.plan).autocast  # its passes run under bf16 autocast
