"""The data path's encoder gives exactly the tokens of the plain one: each piece through the tokenizer's `__call__`.

`ChatTokenizer.tokenize_arrays` encodes a record's pieces in one batch, as int32 arrays, through SegmentEncoder
(the text between added tokens encoded once per process and looked up after). The reference below is
`tokenize` as it was before: every piece encoded on its own with `tokenizer(text, add_special_tokens=False)`,
labels and weights built as Python lists. Both must agree token for token on the bundled examples, with tools,
with truncation and drops, and for tokenizers where cutting at added tokens would not be exact (there the
encoder must not be used).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Regex, normalizers, pre_tokenizers
from transformers import AutoTokenizer

from finetune.data import segment_encoder
from finetune.data.read import parse_bytes
from finetune.data.records import build_records
from finetune.data.segment_encoder import SegmentEncoder
from finetune.data.tokenize import ChatTokenizer, TokenizeOutcome
from finetune.data.types import IGNORE_INDEX, TokenizedRecord
from finetune.settings.data_choices import Truncation

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
QWEN_SPLIT = (  # the pre-tokenizer regex of Qwen2 / Llama 3 style tokenizers
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_LINE = {
    "messages": [
        {"role": "system", "content": "You are the travel desk."},
        {"role": "user", "content": "Weather in  Paris\n\nand Rome?  "},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny, 21 C"},
        {"role": "tool", "tool_call_id": "b", "content": "rain, 14 C"},
        {"role": "assistant", "content": " Paris is sunny; Rome has rain — 14 °C.", "weight": 0.3},
    ],
    "tools": [WEATHER],
}


def _conversations():
    data = b"".join((EXAMPLES / name).read_bytes() for name in ("train.jsonl", "test.jsonl"))
    data += (json.dumps(TOOL_LINE, ensure_ascii=False) + "\n").encode()
    parsed = parse_bytes(data, "examples.jsonl")
    assert parsed.ok, parsed.errors
    return parsed.conversations


def _reference(chat: ChatTokenizer, record, max_seq_len: int, truncation: str) -> TokenizeOutcome:
    """`ChatTokenizer.tokenize` before arrays: each piece through `__call__`, Python lists all the way."""
    input_ids: list[int] = []
    labels: list[int] = []
    weights: list[float] = []
    for text, weight in chat._pieces(record):
        ids = chat.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        input_ids += ids
        labels += ids if weight > 0 else [IGNORE_INDEX] * len(ids)
        weights += [weight] * len(ids)
    total = len(input_ids)
    cut = max(0, total - max_seq_len)
    if cut:
        first_target = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
        if Truncation(truncation) is Truncation.DROP:
            return TokenizeOutcome(None, "too_long", total, cut)
        if cut >= first_target:
            return TokenizeOutcome(None, "target_would_be_cut", total, cut)
        input_ids, labels, weights = input_ids[cut:], labels[cut:], weights[cut:]
    return TokenizeOutcome(
        TokenizedRecord(input_ids, labels, weights, record.conversation, record.line, cut), None, total, cut
    )


def _tokenizer(toy_model, variant: str):
    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    backend = tokenizer.backend_tokenizer
    if variant == "qwen-like":  # NFC, then a regex split and a byte-level mapping without its own regex
        backend.normalizer = normalizers.NFC()
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(QWEN_SPLIT), "isolated"), pre_tokenizers.ByteLevel(False, use_regex=False)]
        )
    elif variant == "metaspace-first":  # SentencePiece style: only the text's very start gets the prefix
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="Ġ", prepend_scheme="first")
    return tokenizer


@pytest.mark.parametrize(("variant", "segmented"), [("toy", True), ("qwen-like", True), ("metaspace-first", False)])
def test_arrays_equal_the_piece_by_piece_tokens(toy_model, variant, segmented):
    chat = ChatTokenizer(_tokenizer(toy_model, variant))
    assert (chat._segments is not None) is segmented
    conversations = _conversations()
    checked = dropped = truncated = 0
    for policy in ("all", "each", "last"):
        records = [r for i, c in enumerate(conversations) for r in build_records(c, i, policy)]
        for max_seq_len, truncation in ((100_000, "left"), (48, "left"), (48, "drop")):
            for record in records:
                got = chat.tokenize(record, max_seq_len, truncation)
                expected = _reference(chat, record, max_seq_len, truncation)
                assert got == expected, (policy, max_seq_len, truncation, record.line)
                if got.record is not None:  # same values and same Python types (floats stay floats)
                    assert [type(w) for w in got.record.weights] == [type(w) for w in expected.record.weights]
                    truncated += got.record.truncated_tokens > 0
                dropped += got.record is None
                checked += 1
    assert checked > 1000 and dropped and truncated  # every branch was taken


def test_batch_and_repeats_equal_one_by_one(toy_model, monkeypatch):
    """One batch, a warm cache, and a cache cleared in between all give `encode` of each text alone."""
    tokenizer = _tokenizer(toy_model, "toy")
    chat = ChatTokenizer(tokenizer)
    texts = ["", " ", "<|im_start|>", "<|im_end|>\n<|im_start|>user\n  two  spaces\n\n", "x<|im_end|><|im_end|>y"]
    for conversation in _conversations():
        for record in build_records(conversation, 0, "all"):
            texts += [text for text, _ in chat._pieces(record)]
    expected = [tokenizer(t, add_special_tokens=False)["input_ids"] if t else [] for t in texts]
    assert [ids.tolist() for ids in chat.encode_arrays(texts)] == expected
    assert [ids.tolist() for ids in chat.encode_arrays(texts)] == expected  # from the cache now
    monkeypatch.setattr(segment_encoder, "_SEGMENT_CACHE_CHARS", 200)  # cleared again and again
    assert [chat.encode_arrays([t])[0].tolist() for t in texts] == expected
    assert all(ids.dtype == np.int32 for ids in chat.encode_arrays(texts))


def test_cutting_at_added_tokens_is_refused_where_it_would_change_tokens(toy_model):
    """Metaspace "first" prefixes only the text's first stretch: cut at added tokens, later stretches would get
    a prefix they do not have in the whole text. The encoder is not used there, and this shows why."""
    backend = _tokenizer(toy_model, "metaspace-first").backend_tokenizer
    assert SegmentEncoder.for_backend(backend) is None
    forced = SegmentEncoder(backend, ["<|im_start|>", "<|im_end|>"])
    text = "<|im_start|>user hi<|im_end|>"
    assert forced.encode([text])[0].tolist() != backend.encode(text, add_special_tokens=False).ids
    assert not forced._agrees_on_probes(["<|im_start|>", "<|im_end|>"])
