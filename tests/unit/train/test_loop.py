"""The loop's math: accumulation equivalence, step count, LoRA freezing, exact resume, NaN stop."""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from finetune.train.distributed import DistContext
from finetune.train.loop import LoopSettings, TrainingDiverged, TrainingInterrupted, train_loop
from finetune.train.model import add_lora, load_model

BASE = LoopSettings(
    total_steps=6,
    steps_per_epoch=3,
    grad_accum=1,
    devices=1,
    effective_batch=8,
    learning_rate=1e-3,
    warmup_steps=1,
    schedule="cosine",
    last_batch="keep",
    eval_every=2,
    save_every=2,
    keep_checkpoints=2,
    seed=3,
    max_seq_len=64,
)


def _train(toy_model, records, out, settings=BASE, lora=False, on_step=None, model=None):
    model = model or load_model(str(toy_model))
    if lora and model is not None and not hasattr(model, "peft_config"):
        model = add_lora(model, 4, 8, 0.0, seed=0)
    result = train_loop(model, records, records[:5], settings, out, DistContext(), on_step=on_step)
    return model, result


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_grad_accumulation_gives_the_same_weights(toy_model, records, tmp_path):
    """batch 4 × accumulation 2 == batch 8 × accumulation 1 == 8 × 1 padded, on records of different lengths.

    In float64: AdamW divides by sqrt(v), which turns fp32 rounding noise on near-zero gradients into
    visible weight differences; fp64 shows the math itself is the same to ~1e-14.
    """
    weights = []
    for grad_accum, packing in [(1, True), (2, True), (8, False)]:
        settings = dataclasses.replace(BASE, grad_accum=grad_accum, packing=packing)
        model = load_model(str(toy_model), torch.float64)
        _train(toy_model, records, tmp_path / f"run{grad_accum}", settings, model=model)
        weights.append(_weights(model))
    reference = weights[0]
    for other in weights[1:]:
        for name, value in reference.items():
            assert torch.allclose(value, other[name], rtol=0, atol=1e-10), name
    assert not torch.equal(reference["lm_head.weight"], load_model(str(toy_model)).lm_head.weight.double())


def test_takes_exactly_the_planned_steps_and_logs_each(toy_model, records, tmp_path):
    rows = []
    _, result = _train(toy_model, records, tmp_path, on_step=rows.append)
    assert result.steps == BASE.total_steps == len(rows)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert {"step", "epoch", "lr", "train_loss", "grad_norm", "target_tokens", "tokens_per_s"} <= rows[0].keys()
    assert "val_loss" in rows[1] and "val_loss" in rows[2]  # every 2 steps and at the epoch end (step 3)
    assert sum(r["target_tokens"] for r in rows) == 2 * sum(r.num_targets for r in records)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 6


def test_lora_trains_only_the_adapter(toy_model, records, tmp_path):
    base = load_model(str(toy_model))
    before = _weights(base)
    model = add_lora(base, 4, 8, 0.0, seed=0)
    adapter_before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    _train(toy_model, records, tmp_path, model=model)
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert not torch.equal(param, adapter_before[name]) or "lora_B" in name or "lora_A" in name
        else:
            original = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(param, before[original]), name  # bit-identical
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, adapter_before[n])]
    assert len(changed) == len(adapter_before)  # every trainable weight moved


def test_resume_after_sigterm_is_bit_identical(toy_model, records, tmp_path):
    _, full = _train(toy_model, records, tmp_path / "full", lora=True)
    reference = load_file(tmp_path / "full" / "checkpoints" / "step-000006" / "adapter_model.safetensors")

    def stop_after_step_3(row):
        if row["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(TrainingInterrupted) as stopped:
        _train(toy_model, records, tmp_path / "cut", lora=True, on_step=stop_after_step_3)
    assert "--resume" in str(stopped.value) and stopped.value.signum == signal.SIGTERM
    assert (tmp_path / "cut" / "checkpoints" / "step-000003").is_dir()

    resumed_settings = dataclasses.replace(BASE, resume=True)
    _, resumed = _train(toy_model, records, tmp_path / "cut", resumed_settings, lora=True)
    got = load_file(tmp_path / "cut" / "checkpoints" / "step-000006" / "adapter_model.safetensors")
    assert got.keys() == reference.keys()
    for name in reference:
        assert torch.equal(got[name], reference[name]), name
    assert resumed.tokens_processed == full.tokens_processed
    steps = [line for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 6  # no step logged twice


def test_nan_loss_stops_with_a_clear_message(toy_model, records, tmp_path):
    model = load_model(str(toy_model))
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(TrainingDiverged, match="became nan at step 1"):
        _train(toy_model, records, tmp_path, model=model)
