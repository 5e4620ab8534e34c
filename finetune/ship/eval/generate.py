"""Answer prompts with a model (greedy), and measure a house style by plain substring matching."""

from __future__ import annotations

import inspect

import torch

from finetune.data.prompting import prompt_ids, prompt_of, stop_ids
from finetune.data.types import Conversation


def prompt_messages(conversation: Conversation) -> list[dict]:
    """The conversation up to (not including) its final assistant reply, as chat-template input."""
    return [{"role": m.role, "content": m.content} for m in prompt_of(conversation)]


@torch.no_grad()
def generate_ids(
    model, tokenizer, prompts: list[list[dict]], max_new_tokens: int = 96, batch_size: int = 32
) -> list[list[int]]:
    """Greedy new tokens for each prompt (chat messages), up to and including the first stop token.

    Prompts built as training built them (prompting.prompt_ids), left-padded, `batch_size` at a time in order of
    length (less padding); a row leaves its batch as soon as it has stopped, so a batch costs the tokens its rows
    write, not its longest answer times its rows."""
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [prompt_ids(tokenizer, messages) for messages in prompts]
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), i))
    new_ids: list[list[int]] = [[] for _ in encoded]
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        rows = _greedy([encoded[i] for i in chosen], model, pad_id, set(stop_ids(tokenizer)), max_new_tokens)
        for index, row in zip(chosen, rows, strict=True):
            new_ids[index] = row
    return new_ids


def _greedy(encoded: list[list[int]], model, pad_id: int, stops: set[int], max_new_tokens: int) -> list[list[int]]:
    """One left-padded batch decoded greedily with the model's key/value cache; finished rows are dropped from the
    batch (and from the cache) at once."""
    from transformers import DynamicCache

    device, width = model.device, max(len(ids) for ids in encoded)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache, alive = DynamicCache(), torch.arange(len(encoded), device=device)
    cache_name, extra = _forward_names(model)
    written: list[list[int]] = [[] for _ in encoded]
    for _ in range(max_new_tokens):
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{cache_name: cache}, **extra).logits[:, -1, :]  # fmt: skip
        tokens = logits.argmax(-1)
        done = []
        for row, token in zip(alive.tolist(), tokens.tolist(), strict=True):
            written[row].append(token)
            done.append(token in stops)
        if all(done):
            break
        if any(done):  # the finished rows leave the batch and the cache
            keep = torch.tensor([slot for slot, d in enumerate(done) if not d], device=device)
            cache.batch_select_indices(keep)
            alive, tokens, mask, positions = alive[keep], tokens[keep], mask[keep], positions[keep]
        input_ids = tokens[:, None]
        mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=-1)
        positions = positions[:, -1:] + 1
    return written


def _forward_names(model) -> tuple[str, dict]:
    """The name the model's forward takes its key/value cache by (transformers 5.25 renamed `past_key_values` to
    `cache`), and `logits_to_keep=1` where it is known (the vocabulary's logits for the last position only)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = inspect.signature(type(inner).forward).parameters
    return ("cache" if "cache" in names else "past_key_values"), (
        {"logits_to_keep": 1} if "logits_to_keep" in names else {}
    )


def generate_answers(
    model, tokenizer, prompts: list[Conversation], max_new_tokens: int = 96, batch_size: int = 32
) -> list[str]:
    """Greedy answers to each conversation up to (not including) its final assistant reply."""
    rows = generate_ids(model, tokenizer, [prompt_messages(c) for c in prompts], max_new_tokens, batch_size)
    return [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in rows]


def style_rate(answers: list[str], markers: list[str]) -> float:
    """Share of answers that contain every marker (e.g. the greeting and the sign-off)."""
    if not answers:
        return 0.0
    return sum(all(marker in answer for marker in markers) for answer in answers) / len(answers)
