"""ShareGPT lines, as LLaMA-Factory reads them (its data/README.md, default tags):

    {"conversations": [{"from": "human", "value": "..."}, {"from": "function_call", "value": "{\"name\": ...,
      \"arguments\": {...}}"}, {"from": "observation", "value": "..."}, {"from": "gpt", "value": "..."}],
     "system": "... (optional)", "tools": "[{\"name\": ..., \"parameters\": {...}}] (optional, JSON text or a list)"}

Roles: `human` (user), `gpt` (assistant), `system` (first turn only), `function_call` (an assistant
turn that calls tools: a JSON object, or a list of them for parallel calls) and `observation` (the
result, a tool message). `user` and `assistant` are read as `human` and `gpt`. The `id` of the
original ShareGPT exports is allowed and ignored.
"""

from __future__ import annotations

import json
from dataclasses import replace

from finetune.data.formats.conversation import Naming, finish_conversation
from finetune.data.formats.lines import (
    ARGUMENTS_NOT_JSON,
    BAD_TOOLS,
    EMPTY_MESSAGES,
    MESSAGE_NOT_OBJECT,
    MESSAGES_NOT_LIST,
    MISSING_MESSAGES,
    MISSING_ROLE,
    UNKNOWN_ROLE,
    Line,
    check_string,
    check_unknown_keys,
    json_type,
    quote,
    with_article,
)
from finetune.data.formats.openai import parse_function, tool_schema
from finetune.data.types import Conversation, Message, ToolCall

KEYS = ("conversations", "system", "tools", "id")
# Problems are told in the file's own words: turns numbered as in "conversations", roles by their "from".
SHAREGPT_NAMING = Naming(
    noun="turn",
    roles={"user": "human", "assistant": "gpt", "tool": "observation", "calls": "function_call"},
    rule="an optional system turn first, then human and gpt in turn; a function_call is followed by its "
    "observation(s), then by gpt (as LLaMA-Factory reads it: human and observation at odd positions, gpt and "
    "function_call at even ones)",
)
TURN_KEYS = ("from", "value")
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "function_call": "assistant",
    "observation": "tool",
}


def check_sharegpt(obj: dict, line: Line) -> Conversation | None:
    check_unknown_keys(obj, KEYS, "", line)
    system = check_string(obj.get("system"), '"system"', line, required=False)
    tools = _tools(obj.get("tools"), line)
    raw = obj.get("conversations")
    if raw is None:
        line.error(
            MISSING_MESSAGES, 'no "conversations": a ShareGPT line is {"conversations": [{"from": ..., "value": ...}]}'
        )
        return None
    if not isinstance(raw, list):
        line.error(MESSAGES_NOT_LIST, f'"conversations" is {with_article(json_type(raw))}; it must be a list of turns')
        return None
    if not raw:
        line.error(EMPTY_MESSAGES, '"conversations" is an empty list: there is nothing to learn from')
        return None
    messages = [_turn(i, item, line) for i, item in enumerate(raw, start=1)]
    if any(m is None for m in messages) or tools is None or line.errors:
        return None
    if system:
        messages.insert(0, Message("system", system))
    naming = replace(SHAREGPT_NAMING, offset=1 if system else 0)
    return finish_conversation(messages, tools, None, line, naming)


def _tools(value: object, line: Line) -> tuple[dict, ...] | None:
    """LLaMA-Factory keeps `tools` as JSON text of a list of function schemas; a list is taken as it is."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            line.error(BAD_TOOLS, f'"tools" is not valid JSON: {quote(value)}')
            return None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        line.error(BAD_TOOLS, f'"tools" must be a list of function schemas, got {with_article(json_type(value))}')
        return None
    schemas = []
    for i, item in enumerate(value, start=1):
        wrapped = isinstance(item, dict) and "function" in item and "name" not in item
        schema = tool_schema(item, wrapped, f'"tools" item {i}', line)
        if schema is None:
            return None
        schemas.append(schema)
    return tuple(schemas)


def _turn(index: int, item: object, line: Line) -> Message | None:
    where = f"turn {index}: "
    if not isinstance(item, dict):
        line.error(
            MESSAGE_NOT_OBJECT, f'{where}is {with_article(json_type(item))}; a turn is {{"from": ..., "value": ...}}'
        )
        return None
    check_unknown_keys(item, TURN_KEYS, where, line)
    if "from" not in item:
        line.error(MISSING_ROLE, f'{where}no "from"; use one of {", ".join(ROLES)}')
        return None
    speaker = item["from"]
    if not isinstance(speaker, str) or speaker not in ROLES:
        line.error(UNKNOWN_ROLE, f'{where}unknown "from" {quote(speaker)}; use one of {", ".join(ROLES)}')
        return None
    value = check_string(item.get("value"), f'{where}"value"', line)
    if value is None:
        return None
    if speaker == "function_call":
        calls = _calls(value, where, line)
        return None if calls is None else Message("assistant", "", tool_calls=calls)
    return Message(ROLES[speaker], value)


def _calls(value: str, where: str, line: Line) -> tuple[ToolCall, ...] | None:
    """A function_call turn: {"name": ..., "arguments": {...}} or a list of them (parallel calls)."""
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        line.error(
            ARGUMENTS_NOT_JSON,
            f'{where}a function_call value must be JSON {{"name": ..., "arguments": {{...}}}}, got {quote(value)}',
        )
        return None
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = [parse_function(call, "", f"{where}call {i}", line) for i, call in enumerate(items, start=1)]
    return None if any(c is None for c in calls) else tuple(calls)
