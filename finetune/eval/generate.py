"""Answer prompts with a model (greedy), and measure a house style by plain substring matching."""

from __future__ import annotations

import torch

from finetune.data.types import Conversation


@torch.no_grad()
def generate_answers(model, tokenizer, prompts: list[Conversation], max_new_tokens: int = 96) -> list[str]:
    """Greedy answers to each conversation's messages up to (not including) its last assistant reply."""
    model.eval()
    answers = []
    for conversation in prompts:
        messages = list(conversation.messages)
        while messages and messages[-1].role == "assistant":
            messages.pop()
        chat = [{"role": m.role, "content": m.content} for m in messages]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = ids["input_ids"].to(model.device)
        output = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        answers.append(tokenizer.decode(output[0, ids.shape[1] :], skip_special_tokens=True).strip())
    return answers


def style_rate(answers: list[str], markers: list[str]) -> float:
    """Share of answers that contain every marker (e.g. the greeting and the sign-off)."""
    if not answers:
        return 0.0
    return sum(all(marker in answer for marker in markers) for answer in answers) / len(answers)
