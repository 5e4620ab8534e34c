"""Alpaca lines, as LLaMA-Factory reads them (its data/README.md):

    {"instruction": "...", "input": "... (optional)", "output": "...",
     "system": "... (optional)", "history": [["earlier instruction", "earlier reply"], ...]}

The user's turn is the instruction, then a newline and the input when there is one; the reply is
the output. History pairs come first, as earlier turns, and their replies are learned too (as in
LLaMA-Factory; give them weight 0 after `finetune convert` if you do not want that).
"""

from __future__ import annotations

from finetune.data.formats.conversation import finish_conversation
from finetune.data.formats.lines import BAD_HISTORY, Line, check_string, check_unknown_keys, quote
from finetune.data.types import Conversation, Message

KEYS = ("instruction", "input", "output", "system", "history")


def check_alpaca(obj: dict, line: Line) -> Conversation | None:
    check_unknown_keys(obj, KEYS, "", line)
    instruction = check_string(obj.get("instruction"), '"instruction"', line)
    extra = check_string(obj.get("input"), '"input"', line, required=False)
    output = check_string(obj.get("output"), '"output"', line)
    system = check_string(obj.get("system"), '"system"', line, required=False)
    history = _history(obj.get("history"), line)
    if line.errors or instruction is None or output is None or history is None:
        return None
    messages = [Message("system", system)] if system else []
    for question, answer in history:
        messages += [Message("user", question), Message("assistant", answer)]
    prompt = f"{instruction}\n{extra}" if extra else instruction
    messages += [Message("user", prompt), Message("assistant", output)]
    return finish_conversation(messages, (), None, line)


def _history(value: object, line: Line) -> list[tuple[str, str]] | None:
    if value is None:
        return []
    shape = '"history" must be a list of ["instruction", "reply"] pairs'
    if not isinstance(value, list):
        line.error(BAD_HISTORY, f"{shape}; got {quote(value)}")
        return None
    pairs = []
    for i, pair in enumerate(value, start=1):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            line.error(BAD_HISTORY, f"{shape}; item {i} is {quote(pair)}")
            return None
        question = check_string(pair[0], f"history item {i} instruction", line)
        answer = check_string(pair[1], f"history item {i} reply", line)
        if question is None or answer is None:
            return None
        pairs.append((question, answer))
    return pairs
