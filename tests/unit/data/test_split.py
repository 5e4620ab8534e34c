"""The validation split: by whole conversation, deterministic, no leakage, duplicates kept together."""

from __future__ import annotations

import pytest

from finetune.data.prepare import prepare_conversations
from finetune.data.split import auto_val_fraction, remove_overlap, split_conversations
from finetune.data.types import Conversation, Message
from finetune.settings.config import RunConfig


def _conversations(n: int, duplicates: int = 0) -> list[Conversation]:
    convs = [
        Conversation((Message("user", f"question {i}"), Message("assistant", f"answer {i}")), line=i + 1)
        for i in range(n)
    ]
    copies = [Conversation(c.messages, line=n + j + 1) for j, c in enumerate(convs[:duplicates])]
    return convs + copies


def test_split_is_deterministic_and_seed_dependent():
    convs = _conversations(100)
    a = split_conversations(convs, 0.2, seed=1)
    assert [c.line for c in a.val] == [c.line for c in split_conversations(convs, 0.2, seed=1).val]
    assert [c.line for c in a.val] != [c.line for c in split_conversations(convs, 0.2, seed=2).val]
    assert len(a.val) == 20 and len(a.train) == 80
    # the file's order does not decide who is held out
    assert {c.line for c in split_conversations(convs[::-1], 0.2, seed=1).val} == {c.line for c in a.val}


@pytest.mark.parametrize("seed", range(5))
def test_no_conversation_or_duplicate_on_both_sides(seed):
    split = split_conversations(_conversations(60, duplicates=20), 0.25, seed)
    assert not {c.key() for c in split.train} & {c.key() for c in split.val}
    assert len(split.train) + len(split.val) == 80


def test_user_validation_file_loses_its_copies_of_training_conversations():
    train = _conversations(10)
    val = [*_conversations(3), Conversation((Message("user", "new"), Message("assistant", "one")), line=1)]
    split = remove_overlap(train, val)
    assert split.duplicates_removed == 3 and len(split.val) == 1


def test_auto_fraction_by_size():
    assert auto_val_fraction(10)[0] == 0
    assert auto_val_fraction(100)[0] == 0.2
    assert auto_val_fraction(300)[0] == 0.1
    assert auto_val_fraction(10_000)[0] == 0.05
    assert round(auto_val_fraction(100_000)[0] * 100_000) == 1000


def test_prepare_reports_both_sides(toy_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    prepared = prepare_conversations(_conversations(50, duplicates=5), None, RunConfig(val_fraction=0.2), tokenizer)
    summary = prepared.summary
    assert summary.conversations + summary.validation_conversations == 55
    assert summary.validation_examples == len(prepared.val) and summary.examples == len(prepared.train)
    assert summary.tokens_in_file == sum(len(r) for r in prepared.train)
    off = prepare_conversations(_conversations(50), None, RunConfig(val_fraction=0), tokenizer)
    assert off.summary.validation_examples == 0 and off.val == []
