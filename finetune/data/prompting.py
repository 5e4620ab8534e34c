"""Prompts for generation built exactly as training builds records, and the tokens that end a reply.

Training renders a conversation with the tokenizer's chat template to text and encodes that text
without adding special tokens (data/tokenize.py). Generation must do the same, or a tokenizer that
adds a BOS of its own would show the tuned model a prompt it never saw in training.
"""

from __future__ import annotations

from finetune.data.tokenize import ChatTokenizer
from finetune.data.types import Conversation, Message


def prompt_of(conversation: Conversation) -> tuple[Message, ...]:
    """The messages a model answers: the conversation up to (not including) its final assistant replies."""
    messages = list(conversation.messages)
    while messages and messages[-1].role == "assistant":
        messages.pop()
    return tuple(messages)


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` followed by the template's assistant header (the model answers next)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def end_of_turn_id(tokenizer) -> int:
    """The special token the chat template closes an assistant reply with: the token training taught as 'stop'."""
    return ChatTokenizer(tokenizer).end_of_turn_id


def stop_ids(tokenizer) -> list[int]:
    """End of turn first, then the tokenizer's own EOS when it is another token."""
    ids = [end_of_turn_id(tokenizer)]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
