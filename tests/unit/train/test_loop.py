"""The loop's math: accumulation equivalence, step count, LoRA freezing, exact resume, NaN stop."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from conftest import make_plan
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from finetune.settings.manifest import write_manifest
from finetune.train.checkpoint import list_checkpoints
from finetune.train.loop import TrainingDiverged, TrainingInterrupted, train_loop
from finetune.train.model import add_lora, load_model
from finetune.train.order import schedule_tokens

PLAN_STEPS = 6


def _train(toy_model, records, out, plan=None, lora=False, on_step=None, model=None, resume=False, billed=None):
    plan = plan or make_plan(records)
    model = model or load_model(str(toy_model))
    if lora and not hasattr(model, "peft_config"):
        model = add_lora(model, 4, 8, 0.0, seed=0)
    result = train_loop(model, records, records[:5], plan, out, on_step=on_step, resume=resume, billed=billed)
    return model, result


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_grad_accumulation_gives_the_same_weights(toy_model, records, tmp_path):
    """batch 4 x accumulation 2 == batch 8 x accumulation 1 == 1 x 8 padded, on records of different lengths.

    One layer, two steps, float64: AdamW divides by sqrt(v), which turns fp32 rounding noise on near-zero
    gradients into visible weight differences; fp64 shows the math itself is the same to ~1e-14.
    """
    weights = []
    for batch, grad_accum, packing in [(8, 1, True), (4, 2, True), (1, 8, False)]:
        plan = make_plan(records, batch_size=batch, grad_accum=grad_accum, packing=packing, max_steps=2)
        model = AutoModelForCausalLM.from_pretrained(toy_model, num_hidden_layers=1, dtype=torch.float64)
        _train(toy_model, records, tmp_path / f"run{grad_accum}", plan, model=model)
        weights.append(_weights(model))
    reference = weights[0]
    for other in weights[1:]:
        for name, value in reference.items():
            assert torch.allclose(value, other[name], rtol=0, atol=1e-10), name
    assert not torch.equal(reference["lm_head.weight"], load_model(str(toy_model)).lm_head.weight.double())


def test_passes_on_a_cpu_give_the_weights_of_one_pass(toy_model, records, tmp_path, monkeypatch):
    """On a CPU a micro-batch runs as passes of at most one packed row (pass_tokens): the same weights, and
    more forward/backward passes than micro-batches (fp64, one layer, as above)."""
    from finetune.train import distributed
    from finetune.train.objective import TokenNormalisedSFT

    assert distributed.pass_tokens(make_plan(records), "cpu") == 64  # the plan's max_seq_len
    assert distributed.pass_tokens(make_plan(records), "cuda") is None  # a GPU keeps it whole
    weights, runs = [], []
    for budget in (None, 64):
        monkeypatch.setattr(distributed, "pass_tokens", lambda plan, device_type, budget=budget: budget)
        seen: list[int] = []

        class Counted(TokenNormalisedSFT):
            def loss(self, model, batch, seen=seen):
                if torch.is_grad_enabled():
                    seen.append(batch.num_tokens)
                return super().loss(model, batch)

        plan = make_plan(records, batch_size=8, max_steps=2)
        model = AutoModelForCausalLM.from_pretrained(toy_model, num_hidden_layers=1, dtype=torch.float64)
        train_loop(model, records, [], plan, tmp_path / f"run{budget}", objective=Counted())
        weights.append(_weights(model))
        runs.append(seen)
    assert len(runs[0]) == 2 and len(runs[1]) > 4 and max(runs[1]) <= 64  # 2 steps of one 8-record pass each
    assert sum(runs[0]) == sum(runs[1])
    for name, value in weights[0].items():
        assert torch.allclose(value, weights[1][name], rtol=0, atol=1e-10), name


def test_takes_exactly_the_planned_steps_and_logs_each(toy_model, records, tmp_path):
    rows = []
    _, result = _train(toy_model, records, tmp_path, on_step=rows.append)
    assert result.steps == PLAN_STEPS == len(rows)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert {"step", "epoch", "learning_rate", "train_loss", "grad_norm", "target_tokens", "tokens_per_s"} <= rows[
        0
    ].keys()
    assert "val_loss" in rows[1] and "val_loss" in rows[2]  # every 2 steps and at the epoch end (step 3)
    assert sum(r["target_tokens"] for r in rows) == 2 * sum(r.num_targets for r in records)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 6
    assert result.tokens_processed == 2 * sum(len(r) for r in records)  # counted as it ran: two whole epochs


def test_a_cut_plan_counts_the_tokens_its_steps_read(toy_model, records, tmp_path):
    """--max-steps: the plan's tokens are the tokens of the steps it keeps, and the loop reads exactly those."""
    plan = make_plan(records, max_steps=4)
    lengths = [len(r) for r in records]
    _, result = _train(toy_model, records, tmp_path, plan)
    assert result.tokens_processed == schedule_tokens(lengths, 8, 3, "keep", 4) < 2 * sum(lengths)


def test_the_loop_counts_the_billed_tokens_record_by_record_and_a_resume_goes_on_from_the_checkpoint(
    toy_model, records, tmp_path
):
    """Issue 47: the loop counts what is billed as it reads it (here every other record is not: rows the base model
    answered), the count agrees with the schedule replayed, and it is part of the resumable state: a resumed run goes
    on from the checkpoint's count (planted +1000 in its state.json, it bills 1000 more), never counts anew."""
    billed = [i % 2 == 0 for i in range(len(records))]
    lengths = [len(r) if b else 0 for r, b in zip(records, billed, strict=True)]
    _, full = _train(toy_model, records, tmp_path / "full", lora=True, billed=billed)
    assert full.tokens_billed == schedule_tokens(lengths, 8, 3, "keep", PLAN_STEPS) < full.tokens_processed

    def stop_after_step_3(row):
        if row["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    cut = tmp_path / "cut"
    with pytest.raises(TrainingInterrupted):
        _train(toy_model, records, cut, lora=True, on_step=stop_after_step_3, billed=billed)
    newest = list_checkpoints(cut)[-1]  # the step the signal was seen after
    state_file = newest / "state.json"
    state = json.loads(state_file.read_text())
    assert state["tokens_billed"] == schedule_tokens(lengths, 8, 3, "keep", state["step"])
    state_file.write_text(json.dumps(state | {"tokens_billed": state["tokens_billed"] + 1000}))
    write_manifest(state_file.parent)  # the planted count is the checkpoint's own, not a damaged file set aside
    _, resumed = _train(toy_model, records, cut, lora=True, resume=True, billed=billed)
    assert resumed.tokens_billed == full.tokens_billed + 1000 and resumed.tokens_processed == full.tokens_processed


def test_lora_trains_only_the_adapter(toy_model, records, tmp_path):
    base = load_model(str(toy_model))
    before = _weights(base)
    model = add_lora(base, 4, 8, 0.0, seed=0)
    adapter_before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    _train(toy_model, records, tmp_path, model=model, plan=make_plan(records, max_steps=2))
    for name, param in model.named_parameters():
        if not param.requires_grad:
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

    _, resumed = _train(toy_model, records, tmp_path / "cut", lora=True, resume=True)
    got = load_file(tmp_path / "cut" / "checkpoints" / "step-000006" / "adapter_model.safetensors")
    assert got.keys() == reference.keys()
    for name in reference:
        assert torch.equal(got[name], reference[name]), name
    assert resumed.tokens_processed == full.tokens_processed  # the steps before the resume are counted too
    steps = [line for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 6  # no step logged twice


def test_nan_loss_stops_with_a_clear_message(toy_model, records, tmp_path):
    model = load_model(str(toy_model))
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(TrainingDiverged, match="became nan at step 1"):
        _train(toy_model, records, tmp_path, model=model)


def test_the_objective_is_a_parameter(toy_model, records, tmp_path):
    """Another objective runs through the same loop: its normaliser and its metrics reach metrics.jsonl."""
    from finetune.train.objective import TokenNormalisedSFT

    class PerRecord(TokenNormalisedSFT):
        normaliser_name = "records"
        metric_names = ("targets_per_record",)

        def normaliser(self, examples):
            return len(examples)

        def loss(self, model, batch):
            loss, _ = super().loss(model, batch)
            return loss, {"targets_per_record": torch.tensor(float(batch.num_targets))}

    rows = []
    plan = make_plan(records, max_steps=2)
    train_loop(load_model(str(toy_model)), records, [], plan, tmp_path, objective=PerRecord(), on_step=rows.append)
    assert [r["records"] for r in rows] == [8, 8]
    assert all(r["targets_per_record"] > 0 for r in rows) and "target_tokens" not in rows[0]
