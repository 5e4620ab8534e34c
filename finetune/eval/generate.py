"""Answer prompts with a model (greedy), and measure a house style by plain substring matching."""

from __future__ import annotations

import torch

from finetune.data.types import Conversation


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
    """Greedy answers, generated in left-padded batches."""
    model.eval()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        encoded = [
            tokenizer.apply_chat_template(
                prompt_messages(c), add_generation_prompt=True, tokenize=True, return_dict=False
            )
            for c in prompts[start : start + batch_size]
        ]
        encoded = [ids["input_ids"] if isinstance(ids, dict) else ids for ids in encoded]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in encoded], device=model.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=model.device)
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=pad_id,
        )
        answers += [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in output]
    return answers


def style_rate(answers: list[str], markers: list[str]) -> float:
    """Share of answers that contain every marker (e.g. the greeting and the sign-off)."""
    if not answers:
        return 0.0
    return sum(all(marker in answer for marker in markers) for answer in answers) / len(answers)
