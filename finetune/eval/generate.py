"""Answer prompts with a model (greedy), and measure a house style by plain substring matching."""

from __future__ import annotations

import torch

from finetune.data.types import Conversation
from finetune.prompting import prompt_ids, stop_ids


def prompt_messages(conversation: Conversation) -> list[dict]:
    """The conversation up to (not including) its final assistant reply, as chat-template input."""
    messages = list(conversation.messages)
    while messages and messages[-1].role == "assistant":
        messages.pop()
    return [{"role": m.role, "content": m.content} for m in messages]


@torch.no_grad()
def generate_answers(
    model, tokenizer, prompts: list[Conversation], max_new_tokens: int = 96, batch_size: int = 32
) -> list[str]:
    """Greedy answers, generated in left-padded batches from prompts built as training built them."""
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        encoded = [prompt_ids(tokenizer, prompt_messages(c)) for c in prompts[start : start + batch_size]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in encoded], device=model.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=model.device)
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stop_ids(tokenizer),
            pad_token_id=pad_id,
        )
        answers += [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in output]
    return answers


def style_rate(answers: list[str], markers: list[str]) -> float:
    """Share of answers that contain every marker (e.g. the greeting and the sign-off)."""
    if not answers:
        return 0.0
    return sum(all(marker in answer for marker in markers) for answer in answers) / len(answers)
