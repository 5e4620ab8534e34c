from __future__ import annotations

import random

import pytest

from finetune.data.types import IGNORE_INDEX, TokenizedRecord


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
