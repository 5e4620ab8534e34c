"""The checks of a whole conversation, whatever format it came in: targets, role order, tool calls and results.

Every format reader turns its line into Messages first; this module judges them together and links
each tool result to the call it answers (filling in ids the data left out), so that what is
trained, and what `finetune convert` writes, is complete OpenAI chat.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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


@dataclass(frozen=True)
class Naming:
    """How a format's users call the messages of a line, so that a problem points at what they wrote."""

    noun: str = "message"
    offset: int = 0  # messages made before the line's own list (a system prompt given as its own key)
    roles: dict[str, str] = field(default_factory=dict)  # our role -> the format's name for it
    rule: str = ORDER_RULE

    def at(self, number: int) -> str:
        """Message `number` (1-based, in our list) as the user numbers it."""
        own = number - self.offset
        return f"{self.noun} {own}" if own >= 1 else 'the "system" key'

    def role(self, role: str) -> str:
        """Our role (or "calls", an assistant that makes tool calls) as the format names it."""
        return self.roles.get(role, "assistant" if role == "calls" else role)

    def kind(self, role: str) -> str:
        """ "a user message", "a human turn" """
        return f"{with_article(self.role(role))} {self.noun}"


MESSAGES = Naming()


def finish_conversation(
    messages: list[Message],
    tools: tuple[dict, ...],
    parallel: bool | None,
    line: Line,
    naming: Naming = MESSAGES,
) -> Conversation | None:
    """Judge well-formed messages together; the Conversation when the line has no error."""
    messages = _fill_call_ids(messages)
    _check_duplicate_ids(messages, line, naming)
    if tools:
        _check_functions_known(messages, tools, line, naming)
    if _check_targets(messages, line, naming):
        linked = _check_flow(messages, line, naming)
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


def _check_duplicate_ids(messages: list[Message], line: Line, naming: Naming) -> None:
    first: dict[str, int] = {}
    for i, message in enumerate(messages, start=1):
        for call in message.tool_calls:
            if call.id in first:
                same = f"earlier in the same {naming.noun}"
                earlier = same if first[call.id] == i else f"in {naming.at(first[call.id])}"
                line.error(
                    DUPLICATE_TOOL_CALL_ID,
                    f"{naming.at(i)}: tool call id {quote(call.id)} is already used {earlier}; "
                    "each call needs its own id, or its result cannot be told apart",
                )
            else:
                first[call.id] = i


def _check_functions_known(messages: list[Message], tools: tuple[dict, ...], line: Line, naming: Naming) -> None:
    known = {tool["function"]["name"] for tool in tools}
    for i, message in enumerate(messages, start=1):
        for call in message.tool_calls:
            if call.name not in known:
                line.error(
                    UNKNOWN_FUNCTION,
                    f"{naming.at(i)}: calls {quote(call.name)}, which is not in this line's tools "
                    f"({', '.join(sorted(known))}); add its schema or fix the name",
                )


def _check_targets(messages: list[Message], line: Line, naming: Naming) -> bool:
    """At least one assistant message must be learned; False when there is no assistant message at all."""
    assistants = [m for m in messages if m.role == "assistant"]
    reply = f"{naming.role('assistant')} {naming.noun}"
    if not assistants:
        line.error(NO_TARGET, f"no {reply}: nothing to learn from this conversation")
        return False
    if all(m.weight == 0 for m in assistants):
        line.error(NO_TARGET, f'every {reply} has "weight": 0: nothing to learn from this conversation')
    return True


def _check_flow(messages: list[Message], line: Line, naming: Naming) -> list[Message] | None:
    """Role order, and every tool result linked to an open call before it. The messages with ids filled in."""
    all_ids = {call.id for m in messages for call in m.tool_calls}
    start = 1 if messages[0].role in INSTRUCTION_ROLES else 0
    out = messages[:start]
    previous = "start"  # start | user | assistant | calls (an assistant that made calls) | tool
    open_calls: list = []  # calls of the latest assistant not answered yet
    for i, message in enumerate(messages[start:], start=start):
        after = f"after {naming.kind(_speaker(messages[i - 1]))}" if i else "at the start"
        if message.role == "tool":
            if previous not in ("calls", "tool"):
                line.error(
                    TOOL_WITHOUT_CALL,
                    f"{naming.at(i + 1)} is a tool result {after}: no tool call comes before it",
                )
                return None
            call = _answered_call(message, open_calls, all_ids, i, line, naming)
            if call is None:
                return None
            open_calls.remove(call)
            out.append(replace(message, tool_call_id=call.id))
            previous = "tool"
            continue
        expected = {"start": "user", "user": "assistant", "assistant": "user", "calls": "tool", "tool": "assistant"}
        if message.role != expected[previous]:
            if previous == "calls":
                after = "after an assistant's tool calls" if naming is MESSAGES else f"after {naming.kind('calls')}"
            line.error(
                BAD_ROLE_ORDER,
                f"{naming.at(i + 1)} is {naming.role(_speaker(message))} {after}; "
                f"expected {naming.role(expected[previous])} ({naming.rule})",
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
            f"the conversation ends with {naming.kind(_speaker(messages[-1]))}; "
            f"it must end with {naming.role('assistant')}",
        )
        return None
    return out


def _speaker(message: Message) -> str:
    """The message's role, with "calls" for an assistant that makes tool calls (ShareGPT's function_call)."""
    return "calls" if message.role == "assistant" and message.tool_calls else message.role


def _answered_call(message: Message, open_calls: list, all_ids: set[str], i: int, line: Line, naming: Naming):
    """The open call a tool result answers: by `tool_call_id`, else by function name, else the first open one."""
    at = naming.at(i + 1)
    if message.tool_call_id is not None:
        for call in open_calls:
            if call.id == message.tool_call_id:
                return call
        if message.tool_call_id in all_ids:
            line.error(
                TOOL_WITHOUT_CALL,
                f"{at} answers call {quote(message.tool_call_id)}, which is not an open call of the "
                "assistant message before it (it is answered already, or made later)",
            )
        else:
            line.error(
                UNKNOWN_TOOL_CALL_ID,
                f"{at}: tool_call_id {quote(message.tool_call_id)} matches no tool call in this "
                f"conversation (calls: {', '.join(sorted(all_ids))})",
            )
        return None
    if not open_calls:
        line.error(TOOL_WITHOUT_CALL, f"{at} is a tool result, but every call before it is answered already")
        return None
    named = [call for call in open_calls if message.name and call.name == message.name]
    return (named or open_calls)[0]
