"""The checks of a whole conversation, whatever format it came in: targets, role order, tool calls and results.

Every format reader turns its line into Messages first; this module judges them together and links
each tool result to the call it answers (filling in ids the data left out), so that what is
trained, and what `finetune convert` writes, is complete OpenAI chat.
"""

from __future__ import annotations

from dataclasses import replace

from finetune.data.formats.lines import (
    BAD_ROLE_ORDER,
    DUPLICATE_TOOL_CALL_ID,
    NO_TARGET,
    TOOL_WITHOUT_CALL,
    UNKNOWN_FUNCTION,
    UNKNOWN_TOOL_CALL_ID,
    Line,
    quote,
    with_article,
)
from finetune.data.types import Conversation, Message

ORDER_RULE = (
    "an optional system (or developer) message first, then user and assistant in turn; "
    "an assistant's tool calls are followed by their tool results, then by the assistant again"
)
INSTRUCTION_ROLES = ("system", "developer")


def finish_conversation(
    messages: list[Message], tools: tuple[dict, ...], parallel: bool | None, line: Line
) -> Conversation | None:
    """Judge well-formed messages together; the Conversation when the line has no error."""
    messages = _fill_call_ids(messages)
    _check_duplicate_ids(messages, line)
    if tools:
        _check_functions_known(messages, tools, line)
    if _check_targets(messages, line):
        linked = _check_flow(messages, line)
        if linked is not None:
            messages = linked
    if line.errors:
        return None
    return Conversation(tuple(messages), line.number, tools, parallel)


def _fill_call_ids(messages: list[Message]) -> list[Message]:
    """Calls without an id get `call_1`, `call_2`, ... (never one the data already uses)."""
    taken = {call.id for m in messages for call in m.tool_calls if call.id}
    counter = 0
    out = []
    for message in messages:
        if any(not call.id for call in message.tool_calls):
            calls = []
            for call in message.tool_calls:
                if not call.id:
                    counter += 1
                    while f"call_{counter}" in taken:
                        counter += 1
                    call = replace(call, id=f"call_{counter}")
                calls.append(call)
            message = replace(message, tool_calls=tuple(calls))
        out.append(message)
    return out


def _check_duplicate_ids(messages: list[Message], line: Line) -> None:
    first: dict[str, int] = {}
    for i, message in enumerate(messages, start=1):
        for call in message.tool_calls:
            if call.id in first:
                earlier = "earlier in the same message" if first[call.id] == i else f"in message {first[call.id]}"
                line.error(
                    DUPLICATE_TOOL_CALL_ID,
                    f"message {i}: tool call id {quote(call.id)} is already used {earlier}; "
                    "each call needs its own id, or its result cannot be told apart",
                )
            else:
                first[call.id] = i


def _check_functions_known(messages: list[Message], tools: tuple[dict, ...], line: Line) -> None:
    known = {tool["function"]["name"] for tool in tools}
    for i, message in enumerate(messages, start=1):
        for call in message.tool_calls:
            if call.name not in known:
                line.error(
                    UNKNOWN_FUNCTION,
                    f"message {i}: calls {quote(call.name)}, which is not in this line's tools "
                    f"({', '.join(sorted(known))}); add its schema or fix the name",
                )


def _check_targets(messages: list[Message], line: Line) -> bool:
    """At least one assistant message must be learned; False when there is no assistant message at all."""
    assistants = [m for m in messages if m.role == "assistant"]
    if not assistants:
        line.error(NO_TARGET, "no assistant message: nothing to learn from this conversation")
        return False
    if all(m.weight == 0 for m in assistants):
        line.error(NO_TARGET, 'every assistant message has "weight": 0: nothing to learn from this conversation')
    return True


def _check_flow(messages: list[Message], line: Line) -> list[Message] | None:
    """Role order, and every tool result linked to an open call before it. The messages with ids filled in."""
    all_ids = {call.id for m in messages for call in m.tool_calls}
    start = 1 if messages[0].role in INSTRUCTION_ROLES else 0
    out = messages[:start]
    previous = "start"  # start | user | assistant | calls (an assistant that made calls) | tool
    open_calls: list = []  # calls of the latest assistant not answered yet
    for i, message in enumerate(messages[start:], start=start):
        if message.role == "tool":
            if previous not in ("calls", "tool"):
                after = f"after {with_article(messages[i - 1].role)} message" if i else "at the start"
                line.error(TOOL_WITHOUT_CALL, f"message {i + 1} is a tool result {after}: no tool call comes before it")
                return None
            call = _answered_call(message, open_calls, all_ids, i, line)
            if call is None:
                return None
            open_calls.remove(call)
            out.append(replace(message, tool_call_id=call.id))
            previous = "tool"
            continue
        expected = {"start": "user", "user": "assistant", "assistant": "user", "calls": "tool", "tool": "assistant"}
        if message.role != expected[previous]:
            after = f"after {with_article(messages[i - 1].role)} message" if i else "at the start"
            if previous == "calls":
                after = "after an assistant's tool calls"
            line.error(
                BAD_ROLE_ORDER,
                f"message {i + 1} is {message.role} {after}; expected {expected[previous]} ({ORDER_RULE})",
            )
            return None
        if message.role == "assistant":
            previous = "calls" if message.tool_calls else "assistant"
            open_calls = list(message.tool_calls)
        else:
            previous = message.role
        out.append(message)
    if messages[-1].role != "assistant":
        line.error(
            BAD_ROLE_ORDER,
            f"the conversation ends with {with_article(messages[-1].role)} message; it must end with assistant",
        )
        return None
    return out


def _answered_call(message: Message, open_calls: list, all_ids: set[str], i: int, line: Line):
    """The open call a tool result answers: by `tool_call_id`, else by function name, else the first open one."""
    if message.tool_call_id is not None:
        for call in open_calls:
            if call.id == message.tool_call_id:
                return call
        if message.tool_call_id in all_ids:
            line.error(
                TOOL_WITHOUT_CALL,
                f"message {i + 1} answers call {quote(message.tool_call_id)}, which is not an open call of the "
                "assistant message before it (it is answered already, or made later)",
            )
        else:
            line.error(
                UNKNOWN_TOOL_CALL_ID,
                f"message {i + 1}: tool_call_id {quote(message.tool_call_id)} matches no tool call in this "
                f"conversation (calls: {', '.join(sorted(all_ids))})",
            )
        return None
    if not open_calls:
        line.error(TOOL_WITHOUT_CALL, f"message {i + 1} is a tool result, but every call before it is answered already")
        return None
    named = [call for call in open_calls if message.name and call.name == message.name]
    return (named or open_calls)[0]
