from __future__ import annotations

import random

import pytest

from finetune.data.types import IGNORE_INDEX, DataSummary, TokenizedRecord
from finetune.plan.build import build_plan
from finetune.plan.plan import Plan
from finetune.settings.config import RunConfig


def random_records(n: int, seed: int = 0, vocab: int = 400) -> list[TokenizedRecord]:
    """Records of different lengths with a context prefix and a target suffix (some with weight 0.5)."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        length = rng.randint(6, 40)
        ids = [rng.randrange(5, vocab) for _ in range(length)]
        cut = rng.randint(2, length - 2)
        weight = 0.5 if i % 3 == 0 else 1.0
        labels = [IGNORE_INDEX] * cut + ids[cut:]
        weights = [0.0] * cut + [weight] * (length - cut)
        records.append(TokenizedRecord(ids, labels, weights, conversation=i, line=i + 1))
    return records


@pytest.fixture
def records() -> list[TokenizedRecord]:
    return random_records(24)


def make_plan(records: list[TokenizedRecord], **settings) -> Plan:
    """The plan the loop tests run: 24 records, effective batch 8, 2 epochs = 6 steps (unless changed)."""
    values = dict(epochs=2, batch_size=8, lr=1e-3, warmup_steps=1, eval_every=2, save_every=2, seed=3)
    # fp32 pinned: the equivalence tests keep their tolerances whatever Auto would choose for the machine
    values |= dict(max_seq_len=64, val_fraction=0, gpu="cpu", dtype="fp32") | settings
    data = DataSummary(
        examples=len(records), validation_examples=5, conversations=len(records), validation_conversations=5,
        messages=None, tokens_in_file=sum(len(r) for r in records),
    )  # fmt: skip
    return build_plan(RunConfig(**values), data)
