"""Soft targets on replay rows: the KL to the base equals its formula, the chunked path equals the plain one, the
team's records keep the NLL, and the loss stays a mean over every target token of the step (accumulation, resume)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from conftest import make_plan
from gradients import assert_same_gradients, grads
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from finetune.train.batching import pack_batch, pad_batch
from finetune.train.cross_entropy import nll_sum
from finetune.train.distill import kl_sum, reference_kl_sum
from finetune.train.loop import TrainingInterrupted, train_loop
from finetune.train.model import add_lora, load_model
from finetune.train.objective import SoftReplaySFT, SplitBatch, TokenNormalisedSFT

TEAM_ROWS = 16  # records with line > 16 are the replay rows (the last 8 of the 24 test records)


def _moved_lora(toy_model, train_head: bool = False, dtype=torch.float32, layers: int | None = None):
    """A LoRA model whose adapter is no longer zero (tuned != base), as after some training."""
    extra = {} if layers is None else {"num_hidden_layers": layers}
    base = AutoModelForCausalLM.from_pretrained(toy_model, dtype=dtype, **extra)
    model = add_lora(base, 4, 8, 0.0, seed=0, train_head=train_head)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.05 * torch.randn_like(param))
    return model


def test_kl_equals_its_formula_by_hand(toy_model, records):
    """sum over target positions of w · Σ_v p_base(v) (log p_base(v) − log p_tuned(v)), one record at a time."""
    model = _moved_lora(toy_model)
    expected = 0.0
    for r in records[:4]:
        ids = torch.tensor([r.input_ids])
        with torch.no_grad():
            tuned = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            with model.disable_adapter():
                base = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        for i in range(1, len(r)):
            if r.labels[i] != -100:
                q = base[i - 1].exp()
                expected += r.weights[i] * float((q * (base[i - 1] - tuned[i - 1])).sum())
    got = float(kl_sum(model, pack_batch(records[:4], 128, pad_id=0)))
    assert expected > 0.01
    assert abs(got - expected) < 1e-4 * expected


@pytest.mark.parametrize("train_head", [False, True])
def test_chunked_kl_matches_the_plain_path_loss_and_gradients(toy_model, records, train_head):
    """Several chunks (the last partial), with the output layer trained beside the adapter or not: the base side
    reads the original head, the tuned side the trained one."""
    model = _moved_lora(toy_model, train_head)
    batch = pad_batch(records[:8], pad_id=0)
    reference = reference_kl_sum(model, batch)
    reference.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    chunked = kl_sum(model, batch, chunk=7)
    chunked.backward()
    assert torch.allclose(chunked, reference, rtol=1e-5)
    assert_same_gradients(grads(model), expected)


def test_the_kl_and_its_gradient_are_zero_while_the_model_is_the_base(toy_model, records):
    """A fresh adapter (B = 0) is the base: nothing to pull back, so the replay rows add no gradient at step 1."""
    model = add_lora(load_model(str(toy_model)), 4, 8, 0.0, seed=0)
    kl = kl_sum(model, pack_batch(records[:6], 128, pad_id=0))
    kl.backward()
    assert abs(float(kl)) < 1e-5
    assert all(float(g.abs().max()) < 1e-6 for g in grads(model).values())


def test_team_records_keep_the_nll_and_evaluation_scores_every_record_by_it(toy_model, records):
    """In training the loss is NLL(team records) + KL(replay rows); in eval mode it is the NLL of every record, the
    number validation, the forgetting curve and the adapter scale always reported."""
    model = _moved_lora(toy_model)
    plan = make_plan(records)
    objective = SoftReplaySFT(TEAM_ROWS)
    mixed = records[12:20]  # lines 13..20: four team records, four replay rows
    batch = objective.batch(mixed, plan, pad_id=0)
    assert isinstance(batch, SplitBatch) and batch.text is not None and batch.soft is not None
    team, replay = mixed[:4], mixed[4:]
    with torch.no_grad():
        model.train()
        trained, _ = objective.loss(model, batch)
        expected = nll_sum(model, pack_batch(team, 64, 0)) + kl_sum(model, pack_batch(replay, 64, 0))
        assert torch.allclose(trained, expected, rtol=1e-5)
        model.eval()
        evaluated, _ = objective.loss(model, batch)
        plain, _ = TokenNormalisedSFT().loss(model, pack_batch(mixed, 64, 0))
        assert torch.allclose(evaluated, plain, rtol=1e-5)
    assert objective.normaliser(mixed) == sum(r.num_targets for r in mixed)  # the step's every target token


def _soft_run(toy_model, records, out, plan, model=None, on_step=None, resume=False):
    model = model or add_lora(load_model(str(toy_model)), 4, 8, 0.0, seed=0)
    result = train_loop(
        model, records, records[:5], plan, out, objective=SoftReplaySFT(TEAM_ROWS), on_step=on_step, resume=resume
    )
    return model, result


def test_accumulation_gives_the_weights_of_one_batch(toy_model, records, tmp_path):
    """batch 4 x accumulation 2 == batch 8 x 1 == 1 x 8 padded with replay rows in the steps (float64, one layer,
    from an adapter already moved off the base): the KL sums are divided by the whole step's target tokens, never
    averaged per micro-batch."""
    weights = []
    for batch, grad_accum, packing in [(8, 1, True), (4, 2, True), (1, 8, False)]:
        plan = make_plan(records, batch_size=batch, grad_accum=grad_accum, packing=packing, max_steps=3)
        moved = _moved_lora(toy_model, dtype=torch.float64, layers=1)  # tuned != base: the KL and its gradient count
        model, _ = _soft_run(toy_model, records, tmp_path / f"run{batch}", plan, moved)
        weights.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    for other in weights[1:]:
        for name, value in weights[0].items():
            assert torch.allclose(value, other[name], rtol=0, atol=1e-10), name


def test_soft_targets_change_the_update_only_through_the_replay_rows(toy_model, records, tmp_path):
    """Against plain supervised tuning: the same steps with no replay row are the same weights; with replay rows
    in, different ones (the KL is really what those rows train on)."""
    team_only = records[:TEAM_ROWS]
    plan = make_plan(team_only, batch_size=8, max_steps=2)
    soft, _ = _soft_run(toy_model, team_only, tmp_path / "soft", plan)
    text = add_lora(load_model(str(toy_model)), 4, 8, 0.0, seed=0)
    train_loop(text, team_only, team_only[:5], plan, tmp_path / "text")
    for (name, a), (_, b) in zip(soft.named_parameters(), text.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    plan = make_plan(records, batch_size=8, max_steps=2)
    soft, _ = _soft_run(toy_model, records, tmp_path / "soft-mixed", plan)
    text = add_lora(load_model(str(toy_model)), 4, 8, 0.0, seed=0)
    train_loop(text, records, records[:5], plan, tmp_path / "text-mixed")
    differ = [n for (n, a), (_, b) in zip(soft.named_parameters(), text.named_parameters(), strict=True)
              if a.requires_grad and not torch.equal(a, b)]  # fmt: skip
    assert differ


def test_resume_after_sigterm_is_bit_identical(toy_model, records, tmp_path):
    plan = make_plan(records)
    _soft_run(toy_model, records, tmp_path / "full", plan)
    reference = load_file(tmp_path / "full" / "checkpoints" / "step-000006" / "adapter_model.safetensors")

    def stop_after_step_3(row):
        if row["step"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(TrainingInterrupted):
        _soft_run(toy_model, records, tmp_path / "cut", plan, on_step=stop_after_step_3)
    _soft_run(toy_model, records, tmp_path / "cut", plan, resume=True)
    got = load_file(tmp_path / "cut" / "checkpoints" / "step-000006" / "adapter_model.safetensors")
    for name in reference:
        assert torch.equal(got[name], reference[name]), name
