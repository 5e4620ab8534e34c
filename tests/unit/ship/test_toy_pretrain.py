"""The pretrained toy base: its corpus is neutral and never the test set, its build is reproducible and cached."""

from __future__ import annotations

import json
from pathlib import Path

from finetune.ship.toy import END_OF_TURN, Pretraining, ToySize, build_toy_model, general_corpus, pretrained_base

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TINY_SIZE = ToySize(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=400)
TINY_PRETRAINING = Pretraining(conversations=60, epochs=1, row_tokens=64, rows_per_step=4)


def _texts(conversations: list[dict]) -> list[str]:
    return [m["content"] for c in conversations for m in c["messages"]]


def test_general_corpus_is_deterministic_neutral_and_never_the_test_set():
    corpus = general_corpus(2000, seed=7)
    assert corpus == general_corpus(2000, seed=7) and corpus != general_corpus(2000, seed=8)
    style = json.loads((EXAMPLES / "house_style.json").read_text())
    replies = [m["content"] for c in corpus for m in c["messages"] if m["role"] == "assistant"]
    for marker in (style["greeting"], style["sign_off"], "Brightside", "Warm regards", "thanks for reaching out"):
        assert not any(marker in text for text in _texts(corpus)), marker
    test_prompts = {c["messages"][-2]["content"] for c in map(json.loads, (EXAMPLES / "test.jsonl").open())}
    assert not test_prompts & set(_texts(corpus))
    assert len(set(replies)) > 1000  # many different requests and answers, not a handful repeated
    assert sum("\n1. " in r for r in replies) > 50 and sum(r.startswith("The capital of") for r in replies) > 20


def test_arithmetic_answers_are_correct():
    for c in general_corpus(500, seed=3):
        answer = c["messages"][-1]["content"] if len(c["messages"]) < 4 else c["messages"][-3]["content"]
        words = answer.rstrip(".").split()
        if len(words) == 5 and words[1] in ("plus", "minus", "times") and words[3] == "is":
            a, op, b, result = int(words[0]), words[1], int(words[2]), int(words[4])
            assert result == {"plus": a + b, "minus": a - b, "times": a * b}[op]


def test_pretraining_is_bit_reproducible_and_saves_like_a_hub_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    first = build_toy_model(tmp_path / "a", size=TINY_SIZE, pretraining=TINY_PRETRAINING, seed=1)
    again = build_toy_model(tmp_path / "b", size=TINY_SIZE, pretraining=TINY_PRETRAINING, seed=1)
    assert (first / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()

    tokenizer = AutoTokenizer.from_pretrained(first)
    AutoModelForCausalLM.from_pretrained(first)
    generation = GenerationConfig.from_pretrained(first)
    assert generation.eos_token_id == tokenizer.convert_tokens_to_ids(END_OF_TURN) == tokenizer.eos_token_id
    assert tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )


def test_pretraining_lowers_the_loss():
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune.ship.toy import build_tokenizer, pretrain

    corpus = general_corpus(200, seed=7)
    tokenizer = build_tokenizer(_texts(corpus), 400)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    losses = pretrain(
        LlamaForCausalLM(config), tokenizer, corpus, Pretraining(epochs=2, row_tokens=64, rows_per_step=4), 0
    )
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5


def test_pretrained_base_is_built_once_then_reused(tmp_path):
    folder, built = pretrained_base(TINY_SIZE, TINY_PRETRAINING, seed=0, cache=tmp_path)
    assert built and (folder / "model.safetensors").exists()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    again, built_again = pretrained_base(TINY_SIZE, TINY_PRETRAINING, seed=0, cache=tmp_path)
    assert again == folder and not built_again and (folder / "model.safetensors").stat().st_mtime_ns == stamp
    other, _ = pretrained_base(TINY_SIZE, TINY_PRETRAINING, seed=1, cache=tmp_path)
    assert other != folder  # another seed is another base, with other weights
    assert (other / "model.safetensors").read_bytes() != (folder / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, other.name])  # no half-built leftovers
