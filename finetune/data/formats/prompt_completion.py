"""Prompt/completion lines, the legacy OpenAI completions format: one user message and one reply.

{"prompt": "2+2?", "completion": "4"}
"""

from __future__ import annotations

from finetune.data.formats.lines import MISSING_CONTENT, Line, check_string, check_unknown_keys
from finetune.data.types import Conversation, Message

KEYS = ("prompt", "completion")


def check_prompt_completion(obj: dict, line: Line) -> Conversation | None:
    check_unknown_keys(obj, KEYS, "", line)
    texts = []
    for key in KEYS:
        if key not in obj:
            line.error(MISSING_CONTENT, f'"{key}" is missing')
            texts.append(None)
        else:
            texts.append(check_string(obj[key], f'"{key}"', line))
    if any(text is None for text in texts) or line.errors:
        return None
    prompt, completion = texts
    return Conversation((Message("user", prompt), Message("assistant", completion)), line.number)
