"""Answer conversations with a model (greedy, through the one decoder: placement/decode.py), and measure a house
style by plain substring matching."""

from __future__ import annotations

from finetune.data.prompting import prompt_of
from finetune.data.types import Conversation
from finetune.placement.decode import generate_ids


def prompt_messages(conversation: Conversation) -> list[dict]:
    """The conversation up to (not including) its final assistant reply, as chat-template input."""
    return [{"role": m.role, "content": m.content} for m in prompt_of(conversation)]


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
