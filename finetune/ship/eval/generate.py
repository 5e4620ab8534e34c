"""Answer prompts with a model (greedy), and measure a house style by plain substring matching."""

from __future__ import annotations

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

    Left-padded batches, prompts built as training built them (prompting.prompt_ids)."""
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = stop_ids(tokenizer)
    new_ids: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        encoded = [prompt_ids(tokenizer, messages) for messages in prompts[start : start + batch_size]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in encoded], device=model.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=model.device)
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stops,
            pad_token_id=pad_id,
        )
        for row in output[:, width:].tolist():
            end = next((i + 1 for i, token in enumerate(row) if token in stops), len(row))
            new_ids.append(row[:end])
    return new_ids


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
