"""Masking invariants: the scored tokens of a record are exactly its target replies + end-of-turn."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from finetune.data.records import build_records
from finetune.data.tokenize import ChatTokenizer
from finetune.data.types import IGNORE_INDEX, Conversation, Message

# Qwen3-style: the last assistant turn gets an empty reasoning block inserted before its content
THINK_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and loop.last %}"
    "{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' + message['content'] + '<|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
)

CONVERSATION = Conversation(
    (
        Message("system", "You are the support team."),
        Message("user", "Where is my order?"),
        Message("assistant", "Hi! It ships today."),
        Message("user", "And the invoice?"),
        Message("assistant", "It is in your account.", 0.5),
    ),
    line=7,
)


@pytest.fixture(scope="module")
def tokenizer(toy_model):
    return AutoTokenizer.from_pretrained(toy_model)


def _scored(tokenizer, record) -> str:
    return tokenizer.decode([t for t, label in zip(record.input_ids, record.labels, strict=True) if label != -100])


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("all", ["Hi! It ships today.<|im_end|>It is in your account.<|im_end|>"]),
        ("last", ["It is in your account.<|im_end|>"]),
        ("each", ["Hi! It ships today.<|im_end|>", "It is in your account.<|im_end|>"]),
    ],
)
def test_targets_decode_to_replies_plus_end_of_turn(tokenizer, policy, expected):
    chat = ChatTokenizer(tokenizer)
    records = [chat.tokenize(r, 1024, "left").record for r in build_records(CONVERSATION, 0, policy)]
    assert [_scored(tokenizer, r) for r in records] == expected
    for record in records:
        assert record.labels[0] == IGNORE_INDEX
        # context carries weight 0; targets carry their message's weight
        assert all((w == 0) == (label == IGNORE_INDEX) for w, label in zip(record.weights, record.labels, strict=True))
    assert 0.5 in records[-1].weights


def test_weight_zero_reply_is_context(tokenizer):
    conversation = Conversation(
        (
            Message("user", "a?"),
            Message("assistant", "first", 0.0),
            Message("user", "b?"),
            Message("assistant", "second"),
        ),
        line=1,
    )
    (record,) = build_records(conversation, 0, "all")
    tokenized = ChatTokenizer(tokenizer).tokenize(record, 1024, "left").record
    assert _scored(tokenizer, tokenized) == "second<|im_end|>"


def test_empty_think_block_is_never_scored(toy_model):
    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    tokenizer.chat_template = THINK_TEMPLATE
    chat = ChatTokenizer(tokenizer)
    (record,) = build_records(CONVERSATION, 0, "all")
    tokenized = chat.tokenize(record, 1024, "left").record
    assert "<think>" in tokenizer.decode(tokenized.input_ids)
    assert _scored(tokenizer, tokenized) == "Hi! It ships today.<|im_end|>It is in your account.<|im_end|>"


def test_truncation_cuts_context_from_the_left_never_a_target(tokenizer):
    chat = ChatTokenizer(tokenizer)
    (last,) = build_records(CONVERSATION, 0, "last")
    full = chat.tokenize(last, 1024, "left")
    target_tokens = full.record.num_targets
    limit = len(full.record) - 5
    cut = chat.tokenize(last, limit, "left")
    assert cut.record is not None and len(cut.record) == limit and cut.cut_tokens == 5
    assert cut.record.num_targets == target_tokens
    assert _scored(tokenizer, cut.record) == _scored(tokenizer, full.record)
    dropped = chat.tokenize(last, limit, "drop")
    assert dropped.record is None and dropped.dropped == "too_long"
    # a limit that would reach into the reply drops the record instead of cutting the target
    too_short = chat.tokenize(last, target_tokens, "left")
    assert too_short.record is None and too_short.dropped == "target_would_be_cut"
