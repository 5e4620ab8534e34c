"""Teacher-forced log-probabilities in padded batches, and KL(tuned || base): on the toy and on known distributions."""

from __future__ import annotations

import math
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

from finetune.ship.eval.likelihood import kl_per_row, target_log_probs
from finetune.train.model import load_model

ROWS = [([5, 9, 14, 3], [21, 7]), ([8], [30, 31, 32, 33, 34]), ([40, 41, 42, 43, 44, 45, 46], [12])]


@pytest.fixture(scope="module")
def toy(toy_model):
    model = load_model(str(toy_model))
    model.eval()
    return model


def test_batched_log_probs_equal_each_row_scored_alone(toy):
    batched = target_log_probs(toy, ROWS, pad_id=0, batch_size=3)
    for (context, target), got in zip(ROWS, batched, strict=True):
        ids = torch.tensor([context + target])
        with torch.no_grad():
            logits = toy(input_ids=ids).logits[0].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        want = [log_probs[len(context) - 1 + j, token].item() for j, token in enumerate(target)]
        assert got == pytest.approx(want, abs=1e-4)


def test_the_kl_of_a_model_with_itself_is_zero(toy):
    rows = kl_per_row(lambda: nullcontext(toy), lambda: nullcontext(toy), ROWS, pad_id=0, batch_size=2)
    assert [n for _, n in rows] == [len(t) for _, t in ROWS]
    assert all(total == pytest.approx(0.0, abs=1e-6) for total, _ in rows)


class FixedNextToken(torch.nn.Module):
    """A 'model' whose next-token distribution is the same at every position: softmax(logits)."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.logits = torch.tensor(logits)
        self.device = torch.device("cpu")

    def forward(self, input_ids, logits_to_keep, **_):
        return SimpleNamespace(logits=self.logits.expand(input_ids.shape[0], logits_to_keep, -1))


def test_kl_on_a_known_pair_of_distributions():
    tuned = FixedNextToken([0.0, math.log(3.0)])  # p = (1/4, 3/4)
    base = FixedNextToken([0.0, 0.0])  # q = (1/2, 1/2)
    expected = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)  # KL(p || q) = 0.1308 nats
    rows = kl_per_row(lambda: nullcontext(tuned), lambda: nullcontext(base), [([0], [1, 1, 0]), ([1, 1], [0])], 0)
    assert rows == [(pytest.approx(3 * expected, rel=1e-5), 3), (pytest.approx(expected, rel=1e-5), 1)]
    reverse = kl_per_row(lambda: nullcontext(base), lambda: nullcontext(tuned), [([0], [1])], 0)
    assert reverse[0][0] == pytest.approx(0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75), rel=1e-5)
