"""GGUF tokenizer metadata: the pre-tokenizer is named only when certain, the supported tokenizers, token types."""

from __future__ import annotations

import copy
import json

import pytest

from finetune.settings.errors import UserError
from finetune.ship.export.gguf_vocab import KNOWN_PRE_TOKENIZERS, check_tokenizer, pre_tokenizer_name, vocabulary


def _tokenizer_json(pre: dict | list, normalizer=None, ignore_merges=False) -> dict:
    steps = {"type": "Sequence", "pretokenizers": pre} if isinstance(pre, list) else pre
    return {
        "normalizer": normalizer,
        "pre_tokenizer": steps,
        "model": {"type": "BPE", "byte_fallback": False, "ignore_merges": ignore_merges},
        "decoder": {"type": "ByteLevel"},
    }


def test_the_toy_tokenizer_is_gpt2s_pre_tokenizer(toy_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    assert pre_tokenizer_name(json.loads(tokenizer.backend_tokenizer.to_str())) == "gpt-2"


def test_known_pre_tokenizers_as_real_models_spell_them():
    # SmolLM2's tokenizer.json: digits one by one, then GPT-2's byte-level regex
    smollm = [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ]
    assert pre_tokenizer_name(_tokenizer_json(smollm)) == "smollm"
    qwen = copy.deepcopy(KNOWN_PRE_TOKENIZERS["qwen2"][0])
    assert pre_tokenizer_name(_tokenizer_json(qwen, normalizer={"type": "NFC"})) == "qwen2"
    llama3 = copy.deepcopy(KNOWN_PRE_TOKENIZERS["llama-bpe"][0])
    assert pre_tokenizer_name(_tokenizer_json(llama3, ignore_merges=True)) == "llama-bpe"


@pytest.mark.parametrize(
    "tokenizer_json",
    [
        # GPT-2's regex but a prefix space added: not what llama.cpp's gpt-2 does
        _tokenizer_json({"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}),
        # Llama 3's split, but merges applied to whole words (llama.cpp's llama-bpe skips them)
        _tokenizer_json(copy.deepcopy(KNOWN_PRE_TOKENIZERS["llama-bpe"][0]), ignore_merges=False),
        # a lowercasing normalizer llama.cpp would not apply
        _tokenizer_json(copy.deepcopy(KNOWN_PRE_TOKENIZERS["gpt-2"][0]), normalizer={"type": "Lowercase"}),
        # a regex llama.cpp has no name for
        _tokenizer_json(
            [
                {"type": "Split", "pattern": {"Regex": r"\p{L}+"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
            ]
        ),
    ],
)
def test_a_pre_tokenizer_not_known_for_certain_is_left_unnamed(tokenizer_json):
    assert pre_tokenizer_name(tokenizer_json) is None


def test_tokenizers_other_than_byte_level_bpe_are_refused_in_one_sentence():
    check_tokenizer(_tokenizer_json(copy.deepcopy(KNOWN_PRE_TOKENIZERS["gpt-2"][0])), "x")  # supported
    sentencepiece = {"model": {"type": "BPE", "byte_fallback": True}, "decoder": {"type": "Sequence"}}
    with pytest.raises(UserError, match="SentencePiece-style BPE with byte fallback") as caught:
        check_tokenizer(sentencepiece, "runs/one")
    assert "runs/one" in str(caught.value) and "byte-level BPE" in str(caught.value)
    with pytest.raises(UserError, match="it is WordPiece"):
        check_tokenizer({"model": {"type": "WordPiece"}, "decoder": {"type": "WordPiece"}}, "x")
    with pytest.raises(UserError, match="tokenizer.json"):
        check_tokenizer(None, "x")


def test_special_tokens_are_control_and_rows_past_the_tokenizer_unused(toy_model):
    import gguf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    rows = len(tokenizer) + 3  # an embedding padded above the tokenizer, as real models often are
    tokens, types = vocabulary(tokenizer, rows)
    assert len(tokens) == len(types) == rows
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokens[end_of_turn] == "<|im_end|>" and types[end_of_turn] == gguf.TokenType.CONTROL
    assert tokens[-1] == f"[PAD{rows - 1}]" and types[-1] == gguf.TokenType.UNUSED
    assert types.count(gguf.TokenType.NORMAL) == len(tokenizer) - 4  # every trained token; 4 specials
    with pytest.raises(UserError, match="embedding rows"):
        vocabulary(tokenizer, len(tokenizer) - 1)
