"""The OpenAI chat fine-tuning format, all of it: one line is one conversation.

    {"messages": [{"role": "system" | "developer" | "user" | "assistant" | "tool", "content": ..., ...}],
     "tools": [{"type": "function", "function": {"name": ..., "parameters": {...}}}],
     "parallel_tool_calls": false}

Messages may carry `name`; content is a string or a list of `{"type": "text", "text": ...}` parts;
assistant messages may carry `weight` and `tool_calls` (`id`, `type: "function"`, `function: {name,
arguments}` with arguments a JSON string), with or without content; tool messages carry
`tool_call_id`. The legacy form (`functions` at the top, `function_call` on an assistant message, role
`function` for its result) is read as the same thing.
"""

from __future__ import annotations

import json
import math

from finetune.data.formats.conversation import finish_conversation
from finetune.data.formats.lines import (
    ARGUMENTS_NOT_JSON,
    BAD_TOOL_CALL,
    BAD_TOOLS,
    BAD_WEIGHT,
    CONTENT_NOT_STRING,
    EMPTY_ASSISTANT,
    EMPTY_CONTENT,
    EMPTY_MESSAGES,
    INVALID_UNICODE,
    MESSAGE_NOT_OBJECT,
    MESSAGES_NOT_LIST,
    MISSING_CONTENT,
    MISSING_MESSAGES,
    MISSING_ROLE,
    NON_TEXT_CONTENT,
    UNKNOWN_KEY,
    UNKNOWN_ROLE,
    Line,
    check_unknown_keys,
    is_encodable,
    json_type,
    quote,
    with_article,
)
from finetune.data.types import ROLES, Conversation, Message, ToolCall

TOP_KEYS = ("messages", "tools", "parallel_tool_calls", "functions")
MESSAGE_KEYS = ("role", "content", "weight", "name", "tool_calls", "tool_call_id", "function_call")
# Keys of a message as the chat completions API returns it: a log of API responses carries them, empty.
RESPONSE_KEYS = ("refusal", "audio", "annotations")
LEGACY_ROLES = {"function": "tool"}  # the legacy result of a `function_call`
NON_TEXT_PARTS = ("image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "video")


def check_chat(obj: dict, line: Line) -> Conversation | None:
    check_unknown_keys(obj, TOP_KEYS, "", line)
    tools = check_tools(obj.get("tools"), obj.get("functions"), line)
    parallel = obj.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        line.error(BAD_TOOLS, f'"parallel_tool_calls" is {quote(parallel)}; it must be true or false')
    raw = obj.get("messages")
    if raw is None:
        line.error(
            MISSING_MESSAGES, 'no "messages": each line must be {"messages": [{"role": ..., "content": ...}, ...]}'
        )
        return None
    if not isinstance(raw, list):
        line.error(MESSAGES_NOT_LIST, f'"messages" is {with_article(json_type(raw))}; it must be a list of messages')
        return None
    if not raw:
        line.error(EMPTY_MESSAGES, '"messages" is an empty list: there is nothing to learn from')
        return None
    messages = [check_message(i, item, line) for i, item in enumerate(raw, start=1)]
    if any(m is None for m in messages) or tools is None:
        return None  # the conversation is only judged on well-formed messages
    return finish_conversation(messages, tools, parallel if isinstance(parallel, bool) else None, line)


# ----------------------------------------------------------------------------- tools


def check_tools(tools: object, functions: object, line: Line) -> tuple[dict, ...] | None:
    """`tools` (and the legacy `functions`) as OpenAI tool schemas; None when one is malformed."""
    schemas: list[dict] = []
    ok = True
    for key, items, wrapped in (("tools", tools, True), ("functions", functions, False)):
        if items is None:
            continue
        if not isinstance(items, list):
            line.error(BAD_TOOLS, f'"{key}" is {with_article(json_type(items))}; it must be a list of function schemas')
            ok = False
            continue
        for i, item in enumerate(items, start=1):
            schema = tool_schema(item, wrapped, f'"{key}" item {i}', line)
            ok = ok and schema is not None
            if schema is not None:
                schemas.append(schema)
    return tuple(schemas) if ok else None


def tool_schema(item: object, wrapped: bool, where: str, line: Line) -> dict | None:
    """One function schema, in the OpenAI `tools` shape {"type": "function", "function": {...}}."""
    function = item
    if wrapped:
        if not isinstance(item, dict) or item.get("type", "function") != "function" or "function" not in item:
            line.error(BAD_TOOLS, f'{where} must be {{"type": "function", "function": {{"name": ..., ...}}}}')
            return None
        function = item["function"]
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        line.error(BAD_TOOLS, f'{where}: a function schema needs a "name" (and usually "description", "parameters")')
        return None
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        line.error(
            BAD_TOOLS, f'{where}: "parameters" must be a JSON schema object, got {with_article(json_type(parameters))}'
        )
        return None
    return {"type": "function", "function": function}


# ----------------------------------------------------------------------------- messages


def check_message(index: int, item: object, line: Line) -> Message | None:
    where = f"message {index}: "
    if not isinstance(item, dict):
        line.error(
            MESSAGE_NOT_OBJECT,
            f'{where}is {with_article(json_type(item))}; a message is {{"role": ..., "content": ...}}',
        )
        return None
    check_unknown_keys(item, MESSAGE_KEYS + RESPONSE_KEYS, where, line)
    check_response_keys(item, where, line)
    role = check_role(item, where, line)
    makes_calls = bool(item.get("tool_calls") or item.get("function_call"))
    content = check_content(item, role, makes_calls, where, line)
    weight = check_weight(item, role, where, line)
    calls = check_tool_calls(item, role, where, line)
    call_id = check_tool_call_id(item, role, where, line)
    name = item.get("name")
    if name is not None and not (isinstance(name, str) and is_encodable(name)):
        line.error(CONTENT_NOT_STRING, f'{where}"name" must be a string, got {quote(name)}')
        return None
    if role is None or content is None or weight is None or calls is None or call_id is False:
        return None
    return Message(role, content, weight, name, calls, call_id or None)


def check_response_keys(item: dict, where: str, line: Line) -> None:
    """`refusal`, `audio`, `annotations` are accepted empty (null, "", []): with something in them, they would
    be dropped without being trained, so they are refused instead."""
    for key in RESPONSE_KEYS:
        value = item.get(key)
        if value in (None, "", []):
            continue
        if key == "audio":
            line.error(NON_TEXT_CONTENT, f'{where}"audio" holds audio: this model and this format take text only')
        elif key == "refusal":
            line.error(
                UNKNOWN_KEY,
                f'{where}"refusal" holds text, which is not trained; put it in "content" if the model should learn '
                "to answer this way, or remove the line",
            )
        else:
            line.error(
                UNKNOWN_KEY, f'{where}"annotations" are not trained; remove them (the content is trained as it is)'
            )


def check_role(item: dict, where: str, line: Line) -> str | None:
    if "role" not in item:
        line.error(MISSING_ROLE, f'{where}no "role"; use one of {", ".join(ROLES)}')
        return None
    role = item["role"]
    if isinstance(role, str) and role in LEGACY_ROLES:
        return LEGACY_ROLES[role]
    if role not in ROLES:
        line.error(UNKNOWN_ROLE, f"{where}unknown role {quote(role)}; use one of {', '.join(ROLES)}")
        return None
    return role


def check_content(item: dict, role: str | None, has_calls: bool, where: str, line: Line) -> str | None:
    """The message text: a string, or text parts joined. Only an assistant with tool calls may have none."""
    value = item.get("content")
    if isinstance(value, list):
        value = _join_parts(value, where, line)
        if value is None:
            return None
    if value is None or (value == "" and has_calls):
        if has_calls:
            return ""
        if role == "assistant":
            line.error(EMPTY_ASSISTANT, f"{where}an assistant message with neither content nor tool calls")
        else:
            name = f'{where}"content"'
            line.error(MISSING_CONTENT, f"{name} is missing" if "content" not in item else f"{name} is null")
        return None
    if not isinstance(value, str):
        line.error(
            CONTENT_NOT_STRING, f'{where}"content" is {with_article(json_type(value))}, not a string or a list of parts'
        )
        return None
    if not is_encodable(value):
        line.error(INVALID_UNICODE, f'{where}"content" holds an invalid \\u escape (an unpaired surrogate)')
        return None
    if not value.strip():
        line.warn(EMPTY_CONTENT, f'{where}"content" is empty')
    return value


def _join_parts(parts: list, where: str, line: Line) -> str | None:
    """Content parts: text parts are joined as templates that take parts render them (back to back)."""
    texts = []
    for i, part in enumerate(parts, start=1):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in NON_TEXT_PARTS:
            line.error(
                NON_TEXT_CONTENT,
                f"{where}content part {i} is {quote(kind)}: this model and this format take text only; "
                "remove the part or describe it in words",
            )
            return None
        if kind != "text" or not isinstance(part.get("text"), str):
            line.error(
                CONTENT_NOT_STRING,
                f'{where}content part {i} must be {{"type": "text", "text": "..."}}, got {quote(part)}',
            )
            return None
        texts.append(part["text"])
    return "".join(texts)


def check_weight(item: dict, role: str | None, where: str, line: Line) -> float | None:
    if "weight" not in item:
        return 1.0
    weight = item["weight"]
    if role is not None and role != "assistant":
        line.error(BAD_WEIGHT, f'{where}"weight" is only allowed on assistant messages, not on {role}')
        return None
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        line.error(BAD_WEIGHT, f'{where}"weight" is {quote(weight)}; it must be a number from 0 to 1')
        return None
    if not 0 <= weight <= 1:
        line.error(BAD_WEIGHT, f'{where}"weight" is {weight}; it must be from 0 (context only) to 1 (fully learned)')
        return None
    return float(weight)


# ----------------------------------------------------------------------------- tool calls


def check_tool_calls(item: dict, role: str | None, where: str, line: Line) -> tuple[ToolCall, ...] | None:
    """`tool_calls` (or the legacy `function_call`) of an assistant message; ids may be left for later."""
    raw, legacy = item.get("tool_calls"), item.get("function_call")
    if raw is None and legacy is None:
        return ()
    if role is not None and role != "assistant":
        line.error(BAD_TOOL_CALL, f"{where}only assistant messages make tool calls, not {role} messages")
        return None
    if legacy is not None:
        if raw is not None:
            line.error(BAD_TOOL_CALL, f'{where}give "tool_calls" or the legacy "function_call", not both')
            return None
        call = parse_function(legacy, "", f'{where}"function_call"', line)
        return None if call is None else (call,)
    if not isinstance(raw, list):
        line.error(BAD_TOOL_CALL, f'{where}"tool_calls" is {with_article(json_type(raw))}; it must be a list of calls')
        return None
    calls = [_check_tool_call(i, call, where, line) for i, call in enumerate(raw, start=1)]
    return None if any(c is None for c in calls) else tuple(calls)


def _check_tool_call(index: int, call: object, where: str, line: Line) -> ToolCall | None:
    at = f"{where}tool call {index}"
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        line.error(
            BAD_TOOL_CALL, f'{at} must be {{"id": ..., "type": "function", "function": {{"name", "arguments"}}}}'
        )
        return None
    call_id = call.get("id", "")
    if not isinstance(call_id, str):
        line.error(BAD_TOOL_CALL, f'{at}: "id" must be a string, got {quote(call_id)}')
        return None
    return parse_function(call.get("function"), call_id, at, line)


def parse_function(function: object, call_id: str, at: str, line: Line) -> ToolCall | None:
    """{"name": ..., "arguments": "<JSON object>"} -> ToolCall. An arguments object is taken as its JSON text."""
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        line.error(BAD_TOOL_CALL, f'{at}: "function" must be {{"name": "...", "arguments": "{{...}}"}}')
        return None
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        line.error(
            ARGUMENTS_NOT_JSON, f"{at}: arguments are {with_article(json_type(arguments))}; they must be a JSON string"
        )
        return None
    if parse_arguments(arguments) is None:
        line.error(
            ARGUMENTS_NOT_JSON,
            f"{at} ({quote(function['name'])}): arguments {quote(arguments)} are not a JSON object; "
            'write them as a JSON string such as "{\\"city\\": \\"Paris\\"}"',
        )
        return None
    return ToolCall(call_id, function["name"], arguments)


def parse_arguments(arguments: str) -> dict | None:
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def check_tool_call_id(item: dict, role: str | None, where: str, line: Line) -> str | bool:
    """The `tool_call_id` of a tool message: the id, "" when absent, False when wrong."""
    call_id = item.get("tool_call_id")
    if call_id is None:
        return ""
    if role is not None and role != "tool":
        line.error(BAD_TOOL_CALL, f'{where}"tool_call_id" belongs on tool messages, not on {role} messages')
        return False
    if not isinstance(call_id, str) or not call_id:
        line.error(BAD_TOOL_CALL, f'{where}"tool_call_id" must be the id of a call, got {quote(call_id)}')
        return False
    return call_id
