"""The one decoder picks what transformers' own `generate(do_sample=False)` picks, token for token: left-padded
batches, rows that stop early (and leave the batch with the padding only they needed), on the toy and on a tiny
random-weight model of SmolLM2's architecture (grouped-query attention, tied embeddings); its cache is allocated once
per batch; its stop tokens include the model's generation_config's."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from finetune.data.tokenize import load_tokenizer
from finetune.placement import decode as decoder
from finetune.placement import kv_cache
from finetune.placement.decode import decode, generate_ids, stops_of

PAD = 0
NEW = 12


def smollm2_like() -> LlamaForCausalLM:
    """SmolLM2-135M's shape in miniature: 3 query heads per key/value head, head width 16, tied embeddings, its
    rope base; random weights."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=320, hidden_size=48, intermediate_size=128, num_hidden_layers=3, num_attention_heads=3,
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, rope_parameters={"rope_theta": 100000.0,
        "rope_type": "default"}, max_position_embeddings=256, pad_token_id=PAD, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


PROMPTS = [[5, 17, 40, 9], [33, 8, 71, 12, 90, 4, 61, 7, 22], [3, 15], [44, 45, 46, 47, 48, 49]]


def reference(model, prompts: list[list[int]], stops: set[int], new: int) -> list[list[int]]:
    """transformers' greedy generate on the same left-padded batch, each row cut after its first stop token."""
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=sorted(stops),
        pad_token_id=PAD, temperature=None, top_p=None, top_k=None,
    )[:, width:].tolist()  # fmt: skip
    rows = []
    for row in out:
        ends = [i for i, token in enumerate(row) if token in stops]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows


def early_stop(model, prompts: list[list[int]]) -> set[int]:
    """A stop token that ends one row at its third token and leaves another running (a row leaves the batch)."""
    free = reference(model, prompts, set(), NEW)
    for tokens in free:
        candidate = tokens[2]
        if any(candidate not in other[:NEW] for other in free if other is not tokens):
            return {candidate}
    pytest.skip("every row writes the same tokens")


@pytest.mark.parametrize("which", ["toy", "smollm2-like"])
def test_greedy_decoding_matches_transformers_generate_token_for_token(which, toy_model):
    model = AutoModelForCausalLM.from_pretrained(toy_model).eval() if which == "toy" else smollm2_like()
    vocab = model.config.vocab_size
    prompts = [[token % vocab for token in prompt] for prompt in PROMPTS]
    stops = early_stop(model, prompts)
    expected = reference(model, prompts, stops, NEW)
    assert min(map(len, expected)) < NEW and max(map(len, expected)) == NEW  # rows stop early, others run on
    assert decode(model, prompts, PAD, stops, NEW) == expected


def test_a_row_that_stops_takes_the_padding_only_it_needed(monkeypatch):
    """The longest prompt's row stops first: the columns of left padding every other row had leave the cache."""
    model = smollm2_like()
    long_first = [[7, 8, 9, 10, 11, 12, 13, 14], [20, 21], [30, 31, 32]]
    free = reference(model, long_first, set(), NEW)
    stops = {free[0][1]}
    if any(stops & set(row[:2]) for row in free[1:]):
        pytest.skip("the stop token ends the other rows too")
    dropped = []
    real_keep = kv_cache.BatchCache.keep
    monkeypatch.setattr(kv_cache.BatchCache, "keep", lambda self, rows, front=0: dropped.append(front) or
                        real_keep(self, rows, front))  # fmt: skip
    assert decode(model, long_first, PAD, stops, NEW) == reference(model, long_first, stops, NEW)
    assert dropped and dropped[0] == 5  # 8 columns wide; the longest remaining prompt needs 3 of them


def test_the_cache_is_allocated_once_per_batch(monkeypatch, toy_model):
    model = AutoModelForCausalLM.from_pretrained(toy_model).eval()
    tokenizer = load_tokenizer(str(toy_model))
    allocations = []
    real = kv_cache._Layer.lazy_initialization
    monkeypatch.setattr(kv_cache._Layer, "lazy_initialization", lambda self, k, v: allocations.append(1) or
                        real(self, k, v))  # fmt: skip
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(5)]
    generate_ids(model, tokenizer, prompts, max_new_tokens=8, batch_size=2)  # three batches
    assert len(allocations) == 3 * model.config.num_hidden_layers


def test_the_generation_configs_stop_tokens_end_answers_too(toy_model):
    model = AutoModelForCausalLM.from_pretrained(toy_model).eval()
    tokenizer = load_tokenizer(str(toy_model))
    model.generation_config.eos_token_id = [77, 78]
    assert {77, 78} <= stops_of(model, tokenizer)
    assert decoder.stop_ids(tokenizer)[0] in stops_of(model, tokenizer)  # the template's end of turn stays
