"""The data formats `finetune` reads, each turned into the same Conversations.

    chat               OpenAI chat: {"messages": [...], "tools": [...]}       (finetune.data.formats.openai)
    prompt_completion  {"prompt": ..., "completion": ...}                     (.prompt_completion)
    sharegpt           {"conversations": [{"from": ..., "value": ...}]}        (.sharegpt, as LLaMA-Factory reads it)
    alpaca             {"instruction": ..., "input": ..., "output": ...}       (.alpaca, as LLaMA-Factory reads it)

A line's format is told by its keys (`line_format`); a file's format is that of its first valid line
(or, when no line is valid, its first line in a known format), unless the user forces one.
"""

from __future__ import annotations

from collections.abc import Callable

from finetune.data.formats.alpaca import check_alpaca
from finetune.data.formats.lines import Line
from finetune.data.formats.openai import check_chat
from finetune.data.formats.prompt_completion import check_prompt_completion
from finetune.data.formats.sharegpt import check_sharegpt
from finetune.data.types import Conversation

CHAT = "chat"
PROMPT_COMPLETION = "prompt_completion"
SHAREGPT = "sharegpt"
ALPACA = "alpaca"
FORMATS = (CHAT, PROMPT_COMPLETION, SHAREGPT, ALPACA)
FORMAT_NAMES = {
    CHAT: "OpenAI chat (messages)",
    PROMPT_COMPLETION: "prompt/completion",
    SHAREGPT: "ShareGPT (conversations)",
    ALPACA: "Alpaca (instruction/output)",
}

Checker = Callable[[dict, Line], Conversation | None]
CHECKERS: dict[str, Checker] = {
    CHAT: check_chat,
    PROMPT_COMPLETION: check_prompt_completion,
    SHAREGPT: check_sharegpt,
    ALPACA: check_alpaca,
}


def line_format(obj: object) -> str | None:
    """The format a JSON object is written in, told by its keys; None when it is in none of them."""
    if not isinstance(obj, dict):
        return None
    if "messages" in obj:
        return CHAT
    if "conversations" in obj:
        return SHAREGPT
    if "instruction" in obj or "output" in obj:
        return ALPACA
    if "prompt" in obj or "completion" in obj:
        return PROMPT_COMPLETION
    return None
