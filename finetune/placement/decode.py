"""The one decoder: every answer the product generates (replay, the retention check, `finetune eval`, the demo, chat
and the serving engine) comes from here.

    ids = generate_ids(model, tokenizer, prompts, max_new_tokens=96, batch_size=32)   # greedy, batched
    rows = decode(model, [prompt_ids], pad_id, stops, 256, Sampling(0.7, 0.9))       # one sampled row (serving)

Prompts are built as training built them (data/prompting.prompt_ids), left-padded, `batch_size` at a time in order of
length (less padding). Each batch allocates its key/value cache once (kv_cache.BatchCache: prompt width + new tokens,
never grown); a row leaves its batch as soon as it stops, and the left padding only longer rows needed goes with
them, so a batch costs the tokens its rows write. A row stops at any stop token: the chat template's end of turn,
the tokenizer's end of sequence and the model's generation_config's `eos_token_id`. Greedy decoding picks what
`model.generate(do_sample=False)` picks, token for token (tests/unit/placement/test_decode.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from finetune.data.prompting import prompt_ids, stop_ids
from finetune.placement.kv_cache import BatchCache, plain_attention_layers


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked: greedy (temperature 0), else sampled from the softmax at `temperature`, cut to
    the smallest set of tokens whose probability reaches `top_p` (transformers' order: temperature, then top-p)."""

    temperature: float = 0.0
    top_p: float = 1.0

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        if self.temperature <= 0:
            return logits.argmax(-1)
        scores = logits.float() / self.temperature
        if self.top_p < 1.0:
            ordered, order = scores.sort(dim=-1)
            cut = ordered.softmax(-1).cumsum(-1) <= 1 - self.top_p
            cut[..., -1] = False  # the likeliest token always stays
            scores = scores.masked_fill(cut.scatter(-1, order, cut), float("-inf"))
        return torch.multinomial(scores.softmax(-1), 1).squeeze(-1)


GREEDY = Sampling()


def stops_of(model, tokenizer) -> set[int]:
    """Every token that ends an answer: the template's end of turn, the tokenizer's EOS, the generation config's."""
    stops = set(stop_ids(tokenizer))
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    stops |= {eos} if isinstance(eos, int) else set(eos or ())
    return stops


@torch.inference_mode()
def generate_ids(
    model, tokenizer, prompts: list[list[dict]], max_new_tokens: int = 96, batch_size: int = 32
) -> list[list[int]]:
    """Greedy new tokens for each prompt (chat messages), up to and including the first stop token."""
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [prompt_ids(tokenizer, messages) for messages in prompts]
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), i))
    stops = stops_of(model, tokenizer)
    new_ids: list[list[int]] = [[] for _ in encoded]
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        rows = decode(model, [encoded[i] for i in chosen], pad_id, stops, max_new_tokens)
        for index, row in zip(chosen, rows, strict=True):
            new_ids[index] = row
    return new_ids


@torch.inference_mode()
def decode(
    model,
    prompts: list[list[int]],
    pad_id: int,
    stops: set[int],
    max_new_tokens: int,
    sampling: Sampling = GREEDY,
    on_token: Callable[[int, int], None] | None = None,
    stop_when: Callable[[int, list[int]], bool] | None = None,
) -> list[list[int]]:
    """New tokens of each prompt (token ids), decoded as one left-padded batch with a cache allocated once.

    A row ends at a stop token (kept), after `max_new_tokens`, or when `stop_when(row, its tokens)` says so (a stop
    string); `on_token(row, token)` sees each token as it is picked (streaming)."""
    device, width = model.device, max(len(ids) for ids in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = _cache_for(model, len(prompts), width + max_new_tokens)
    alive = torch.arange(len(prompts), device=device)
    cache_name, extra = _forward_names(model)
    written: list[list[int]] = [[] for _ in prompts]
    for _ in range(max_new_tokens):
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{cache_name: cache}, **extra).logits[:, -1, :]  # fmt: skip
        tokens = sampling.pick(logits)
        done = []
        for row, token in zip(alive.tolist(), tokens.tolist(), strict=True):
            written[row].append(token)
            if on_token is not None:
                on_token(row, token)
            ended = token in stops or len(written[row]) >= max_new_tokens
            done.append(ended or bool(stop_when and stop_when(row, written[row])))
        if all(done):
            break
        if any(done):  # the finished rows leave the batch and the cache, and the padding only they needed with them
            keep = torch.tensor([slot for slot, d in enumerate(done) if not d], device=device)
            alive, tokens, mask, positions = alive[keep], tokens[keep], mask[keep], positions[keep]
            mask = mask[:, _keep(cache, keep, int(mask.any(0).int().argmax())) :]
        input_ids = tokens[:, None]
        mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=-1)
        positions = positions[:, -1:] + 1
    return written


def _cache_for(model, rows: int, capacity: int):
    from transformers import DynamicCache

    config = getattr(model, "config", None)
    return BatchCache(rows, capacity) if config is not None and plain_attention_layers(config) else DynamicCache()


def _keep(cache, rows: torch.Tensor, front: int) -> int:
    """Only `rows` stay in the cache, and the `front` columns no remaining row attends to leave (BatchCache); how
    many columns left."""
    if isinstance(cache, BatchCache):
        cache.keep(rows, front)
        return front
    cache.batch_select_indices(rows)  # transformers' own cache (sliding windows, linear layers): its columns stay
    return 0


def _forward_names(model) -> tuple[str, dict]:
    """The name the model's forward takes its key/value cache by (transformers 5.25 renamed `past_key_values` to
    `cache`), and `logits_to_keep=1` where it is known (the vocabulary's logits for the last position only)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = inspect.signature(type(inner).forward).parameters
    return ("cache" if "cache" in names else "past_key_values"), (
        {"logits_to_keep": 1} if "logits_to_keep" in names else {}
    )
