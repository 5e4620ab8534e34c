"""The DPO objective: the loss is the formula, an undecidable pair teaches nothing, accumulation changes nothing."""

from __future__ import annotations

import math
import os
import random
import signal

import pytest
import torch
import torch.nn.functional as F
from conftest import make_plan
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from finetune.data.preference import TokenizedPair
from finetune.data.types import IGNORE_INDEX, TokenizedRecord
from finetune.train.loop import TrainingInterrupted, train_loop
from finetune.train.model import add_lora
from finetune.train.preference import DirectPreference, compute_reference


def random_pairs(n: int, seed: int = 0, vocab: int = 400) -> list[TokenizedPair]:
    """Pairs of one prompt each (shared context prefix) with two different answers of different lengths."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        prompt = [rng.randrange(5, vocab) for _ in range(rng.randint(3, 12))]
        sides = []
        for _ in range(2):
            answer = [rng.randrange(5, vocab) for _ in range(rng.randint(2, 10))]
            ids = prompt + answer
            sides.append(
                TokenizedRecord(
                    ids, [IGNORE_INDEX] * len(prompt) + answer, [0.0] * len(prompt) + [1.0] * len(answer), i, i + 1
                )
            )
        pairs.append(TokenizedPair(sides[0], sides[1], i + 1))
    return pairs


def _tiny(toy_model, dtype=torch.float64):
    return AutoModelForCausalLM.from_pretrained(toy_model, num_hidden_layers=1, dtype=dtype)


def _lora_moved(toy_model):
    """A LoRA model whose adapter is not zero, so policy and reference differ."""
    model = add_lora(_tiny(toy_model), 4, 8, 0.0, seed=0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    return model


def _logp_by_hand(model, record: TokenizedRecord) -> torch.Tensor:
    """One record alone, no padding: sum of log p(token) over its target tokens."""
    ids = torch.tensor([record.input_ids])
    logits = model(input_ids=ids).logits[0, :-1].double()
    targets = torch.tensor(record.labels[1:])
    logp = torch.log_softmax(logits, -1)
    scored = targets != IGNORE_INDEX
    return logp[scored].gather(-1, targets[scored][:, None]).sum()


def test_the_loss_is_the_dpo_formula(toy_model):
    pairs = random_pairs(3)
    model = _lora_moved(toy_model)
    beta, weight = 0.3, 0.25
    objective = DirectPreference(beta, sft_weight=weight)
    loss, metrics = objective.loss(model, objective.batch(pairs, None, pad_id=0))

    expected, margins, chosen_sum = 0.0, [], 0.0
    for pair in pairs:
        pc, pr = _logp_by_hand(model, pair.chosen), _logp_by_hand(model, pair.rejected)
        with model.disable_adapter():
            rc, rr = _logp_by_hand(model, pair.chosen), _logp_by_hand(model, pair.rejected)
        margin = beta * ((pc - rc) - (pr - rr))
        sft = -pc / pair.chosen.num_targets
        expected += -F.logsigmoid(margin) + weight * sft
        margins.append(float(margin.detach()))
        chosen_sum += float(pc)
    assert abs(margins[0]) > 1e-4  # the adapter moved the model: the check is not 0 == 0
    assert torch.allclose(loss, expected, rtol=1e-10, atol=1e-10)
    assert metrics["reward_margin"].item() == pytest.approx(sum(margins), rel=1e-9)
    assert metrics["reward_accuracy"].item() == sum(m > 0 for m in margins)
    assert metrics["chosen_logp"].item() == pytest.approx(chosen_sum, rel=1e-9)
    assert objective.normaliser(pairs) == 3


def test_a_pair_with_identical_answers_has_zero_gradient(toy_model):
    pair = random_pairs(1, seed=4)[0]
    same = TokenizedPair(pair.chosen, pair.chosen, 1)
    model = _lora_moved(toy_model)
    objective = DirectPreference(0.1)
    loss, metrics = objective.loss(model, objective.batch([same], None, pad_id=0))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)
    assert max(float(g.abs().max()) for g in grads) < 1e-12
    assert loss.item() == pytest.approx(math.log(2))  # -log sigmoid(0)
    assert metrics["reward_accuracy"].item() == 0  # a tie is not a win

    # and a real pair does move the adapter (the zero above is about the pair, not a frozen model)
    model.zero_grad()
    loss, _ = objective.loss(model, objective.batch([pair], None, pad_id=0))
    loss.backward()
    assert max(float(p.grad.abs().max()) for p in model.parameters() if p.requires_grad) > 1e-6


def test_precomputed_reference_equals_the_starting_model(toy_model):
    pairs = random_pairs(4, seed=2)
    model = _tiny(toy_model)
    compute_reference(model, pairs, torch.device("cpu"), pad_id=0, batch_pairs=3)
    for pair in pairs:
        assert pair.reference[0] == pytest.approx(float(_logp_by_hand(model, pair.chosen)), rel=1e-10)
        assert pair.reference[1] == pytest.approx(float(_logp_by_hand(model, pair.rejected)), rel=1e-10)
    # at the start the policy is the reference: zero margins, loss log 2 per pair
    objective = DirectPreference(0.1, precomputed_reference=True)
    loss, metrics = objective.loss(model, objective.batch(pairs, None, pad_id=0))
    assert loss.item() == pytest.approx(4 * math.log(2), rel=1e-9)
    assert abs(metrics["reward_margin"].item()) < 1e-9


def test_accumulation_gives_the_same_weights_as_one_batch(toy_model, tmp_path):
    """Full preference tuning, fp64, one layer: 4 pairs x 1 == 2 x 2 == 1 x 4 (the loss is a mean over pairs)."""
    pairs = random_pairs(12, seed=7)
    weights = []
    for batch, accum in [(4, 1), (2, 2), (1, 4)]:
        plan = make_plan(
            pairs, method="dpo", base_method="full", batch_size=batch, grad_accum=accum, max_steps=2, beta=0.5
        )
        model = _tiny(toy_model)
        compute_reference(model, pairs, torch.device("cpu"), pad_id=0)
        objective = DirectPreference(0.5, precomputed_reference=True)
        rows = []
        train_loop(model, pairs, pairs[:3], plan, tmp_path / f"run{accum}", objective=objective, on_step=rows.append)
        assert rows[-1]["pairs"] == 4 and "val_reward_accuracy" in rows[-1]
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
    for other in weights[1:]:
        for name, value in weights[0].items():
            assert torch.allclose(value, other[name], rtol=0, atol=1e-10), name
    assert not torch.equal(weights[0]["lm_head.weight"], _tiny(toy_model).lm_head.weight)


def test_sigterm_then_resume_equals_an_uninterrupted_dpo_run(toy_model, tmp_path):
    """LoRA DPO (reference = adapter off): stop after step 2 of 4, resume, the adapter is bit-identical."""
    pairs = random_pairs(8, seed=5)
    plan = make_plan(pairs, method="dpo", batch_size=2, epochs=1, lr=1e-2, save_every=1)

    def run(out, on_step=None, resume=False):
        model = add_lora(_tiny(toy_model, torch.float32), 4, 8, 0.0, seed=0)
        train_loop(model, pairs, [], plan, out, objective=DirectPreference(0.1), on_step=on_step, resume=resume)
        return load_file(out / "checkpoints" / "step-000004" / "adapter_model.safetensors")

    reference = run(tmp_path / "full")

    def stop_after_step_2(row):
        if row["step"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(TrainingInterrupted):
        run(tmp_path / "cut", on_step=stop_after_step_2)
    got = run(tmp_path / "cut", resume=True)
    assert all(torch.equal(got[name], reference[name]) for name in reference)
    assert any(float(v.abs().max()) > 0 for name, v in reference.items() if "lora_B" in name)  # it did learn
