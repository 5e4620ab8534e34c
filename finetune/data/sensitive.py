"""Sensitive data in conversations, found before training (docs/sensitive-data.md); the detectors of one text are
detectors.py's.

    conversations, found = scan_conversations(conversations, redact=True)   # values replaced by <EMAIL>, ...
    summary = summarize(found, "train.jsonl", setting="redact")             # counts, roles, lines: never a value

Every text of a conversation that a chat template may render is scanned: each message's content (its text parts
joined, as the reader joins them), its `name`, each tool call's arguments (decoded: a value written as a JSON number,
or behind a \\u escape, is found too), name and id, a tool result's `tool_call_id`, and the conversation's tool
schemas. Redacting keeps the arguments and the schemas JSON (redaction.py: a number found becomes a placeholder
string). A Found says where a value is and what kind it is, never the value: summaries, messages, JSON and events
carry counts, roles and lines only.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass

from finetune.data.detectors import KINDS, NAMES, find_spans, redact_text
from finetune.data.redaction import redact_arguments, redact_document
from finetune.data.types import Conversation, Message, Problem
from finetune.settings.errors import DataError
from finetune.settings.wording import ref

TOOLS = -1  # Found.message of a value in the conversation's tool schemas (its role: "tools")
LINES_LISTED = 20  # a summary names this many lines per file at most (the counts are exact)


@dataclass(frozen=True)
class Found:
    """One value found in a conversation, as summaries name it: file line, role, kind, place in the message."""

    line: int
    message: int  # index of the message in its conversation
    role: str
    kind: str
    field: str  # "content", or "tool_calls[i].arguments"
    start: int
    end: int


# ----------------------------------------------------------------------------- conversations


def _texts(message: Message) -> list[tuple[str, str]]:
    """(field, text) of a message that a template may render: its content, its name, and each tool call's arguments
    (decoded and written out again, so an escaped or numeric value reads as it is), name and id; a tool result's
    call id."""
    texts = [("content", message.content), ("name", message.name or ""), ("tool_call_id", message.tool_call_id or "")]
    for i, call in enumerate(message.tool_calls):
        texts += [(f"tool_calls[{i}].arguments", _decoded(call.arguments)), (f"tool_calls[{i}].name", call.name),
                  (f"tool_calls[{i}].id", call.id)]  # fmt: skip
    return texts


def _decoded(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except (ValueError, RecursionError):  # the readers refuse such arguments; scanned as they are
        return arguments


def scan_conversation(conversation: Conversation) -> list[Found]:
    found = []
    for index, message in enumerate(conversation.messages):
        for where, text in _texts(message):
            for span in find_spans(text):
                found.append(Found(conversation.line, index, message.role, span.kind, where, span.start, span.end))
    for j, schema in enumerate(conversation.tools):
        for span in find_spans(json.dumps(schema, ensure_ascii=False)):
            found.append(Found(conversation.line, TOOLS, "tools", span.kind, f"tools[{j}]", span.start, span.end))
    return found


def _redact_message(message: Message, mine: list[Found]) -> Message:
    def text(where: str, value: str) -> str:
        return redact_text(value, [f for f in mine if f.field == where])

    calls = tuple(
        dataclasses.replace(
            call,
            id=text(f"tool_calls[{i}].id", call.id),
            name=text(f"tool_calls[{i}].name", call.name),
            arguments=redact_arguments(call.arguments)
            if any(f.field == f"tool_calls[{i}].arguments" for f in mine)
            else call.arguments,
        )
        for i, call in enumerate(message.tool_calls)
    )
    return dataclasses.replace(
        message,
        content=text("content", message.content),
        name=text("name", message.name) if message.name else message.name,
        tool_calls=calls,
        tool_call_id=text("tool_call_id", message.tool_call_id) if message.tool_call_id else message.tool_call_id,
    )


def redact_conversation(conversation: Conversation, found: list[Found]) -> Conversation:
    """The conversation with every value in `found` replaced by its placeholder."""
    if not found:
        return conversation
    messages = list(conversation.messages)
    for index in sorted({f.message for f in found} - {TOOLS}):
        messages[index] = _redact_message(messages[index], [f for f in found if f.message == index])
    tools = tuple(
        redact_document(schema) if any(f.field == f"tools[{j}]" for f in found) else schema
        for j, schema in enumerate(conversation.tools)
    )
    return dataclasses.replace(conversation, messages=tuple(messages), tools=tools)


def scan_conversations(conversations: list[Conversation], redact: bool = False) -> tuple[list[Conversation], list]:
    """Every value found in `conversations`, and the conversations (with placeholders in place when `redact`)."""
    found_all: list[Found] = []
    out = []
    for conversation in conversations:
        found = scan_conversation(conversation)
        found_all += found
        out.append(redact_conversation(conversation, found) if redact else conversation)
    return out, found_all


def scan_pairs(pairs: list, redact: bool = False) -> tuple[list, list[Found]]:
    """`scan_conversations` for preference pairs (data/preference.py): the prompt, then the chosen answer, then the
    rejected one, as the messages of one conversation."""
    found_all: list[Found] = []
    out = []
    for pair in pairs:
        whole = Conversation((*pair.prompt, pair.chosen, pair.rejected), pair.line, tools=pair.tools)
        found = scan_conversation(whole)
        found_all += found
        if redact and found:
            whole = redact_conversation(whole, found)
            messages = whole.messages
            pair = dataclasses.replace(
                pair, prompt=messages[:-2], chosen=messages[-2], rejected=messages[-1], tools=whole.tools
            )
        out.append(pair)
    return out, found_all


def redacted(conversations: list[Conversation]) -> list[Conversation]:
    return scan_conversations(conversations, redact=True)[0]


# ----------------------------------------------------------------------------- summaries (never a value)


def summarize(found: list[Found], file: str, setting: str = "warn") -> dict:
    """What was found in one file, as JSON: counts by kind, by role and by both, and the lines (the first
    LINES_LISTED of them). `replaced` counts the values the placeholders took the place of (redact)."""
    lines = sorted({f.line for f in found})
    return {
        "setting": setting,
        "total": len(found),
        "by_kind": dict(Counter(f.kind for f in found)),
        "by_role": dict(Counter(f.role for f in found)),
        "by_kind_and_role": {
            kind: dict(Counter(f.role for f in found if f.kind == kind)) for kind in KINDS if any(f.kind == kind for f in found)
        },
        "replaced": len(found) if setting == "redact" else 0,
        "files": {file: {"values": len(found), "lines": lines[:LINES_LISTED], "line_count": len(lines)}} if found else {},
    }  # fmt: skip


def merge(summaries: list[dict]) -> dict:
    """One summary of several files' (the data file's and the validation file's)."""
    merged = summarize([], "", summaries[0]["setting"] if summaries else "warn")
    for s in summaries:
        merged["total"] += s["total"]
        merged["replaced"] += s["replaced"]
        for key in ("by_kind", "by_role"):
            merged[key] = dict(Counter(merged[key]) + Counter(s[key]))
        for kind, roles in s["by_kind_and_role"].items():
            merged["by_kind_and_role"][kind] = dict(Counter(merged["by_kind_and_role"].get(kind, {})) + Counter(roles))
        merged["files"] |= s["files"]
    return merged


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{('es' if noun.endswith('s') else 's') * (n != 1)}"


def sentence(summary: dict) -> str:
    """One sentence of a summary: '5 values: 2 e-mail addresses (1 in assistant replies), ...; train.jsonl lines
    3, 5 and 9'. No value is ever in it."""
    parts = []
    for kind in KINDS:
        if kind not in summary["by_kind"]:
            continue
        n = summary["by_kind"][kind]
        in_replies = summary["by_kind_and_role"].get(kind, {}).get("assistant", 0)
        parts.append(_count(n, NAMES[kind]) + (f" ({in_replies:,} in assistant replies)" if in_replies else ""))
    places = []
    for file, where in summary["files"].items():
        shown = ", ".join(str(line) for line in where["lines"])
        more = (
            f" and {where['line_count'] - len(where['lines'])} more"
            if where["line_count"] > len(where["lines"])
            else ""
        )
        places.append(f"{file} line{'s' * (where['line_count'] != 1)} {shown}{more}")
    return f"{_count(summary['total'], 'value')}: {', '.join(parts)}; {'; '.join(places)}"


def of_sides(found_by_source: dict[str, list[Found]], setting: str) -> dict:
    """One summary of a run's files, each named by the setting that names it ("data", "val_file"): the token
    cache keeps it so, since an entry is keyed by the files' bytes and a renamed file reads the same entry."""
    return merge([summarize(found, source, setting) for source, found in found_by_source.items()])


def named(stored: dict | None, names: dict[str, str]) -> dict | None:
    """A summary kept by `of_sides`, its files named as this run names them."""
    if stored is None:
        return None
    return stored | {"files": {names.get(source, source): where for source, where in stored["files"].items()}}


def refuse_if_found(summary: dict | None) -> None:
    """With sensitive_data refuse, any value found stops the run here, before planning: one message, no value."""
    if summary is None or summary["setting"] != "refuse" or not summary["total"]:
        return
    raise DataError(
        f"sensitive data found, so {ref('sensitive_data', 'refuse')} stops before planning: {sentence(summary)}. "
        f"Remove them from the data, or train on placeholders (<EMAIL>, <CARD>, ...) with "
        f"{ref('sensitive_data', 'redact')}; `finetune validate` lists them (docs/sensitive-data.md)"
    )


# ----------------------------------------------------------------------------- `finetune validate`, the previews

SENSITIVE_DATA = "sensitive_data"  # the validation code (docs/formats.md)
FINDINGS_LISTED = 1000  # --json's "findings" lists this many at most (the counts are exact)


def scanned_file(parsed, setting: str):
    """A read file (ParsedFile, or preference.py's file of pairs) scanned: its conversations or pairs (with
    placeholders when `setting` is redact), one
    `sensitive_data` problem when anything was found (an error with refuse, else a warning), and the summary
    `finetune validate --json` prints (with the place of each value found, never the value)."""
    if hasattr(parsed, "pairs"):
        pairs, found = scan_pairs(parsed.pairs, setting == "redact")
        parsed = dataclasses.replace(parsed, pairs=pairs)
    else:
        conversations, found = scan_conversations(parsed.conversations, setting == "redact")
        parsed = dataclasses.replace(parsed, conversations=conversations)
    summary = summarize(found, parsed.path.replace("\\", "/").rsplit("/", 1)[-1], setting)
    summary["findings"] = [dataclasses.asdict(f) for f in found[:FINDINGS_LISTED]]
    if not found:
        return parsed, summary
    if setting == "refuse":
        message = f"sensitive data, which {ref('sensitive_data', 'refuse')} does not train on: {sentence(summary)}"
        message += f"; remove them, or train on placeholders with {ref('sensitive_data', 'redact')}"
        parsed.errors = [*parsed.errors, Problem(found[0].line, SENSITIVE_DATA, message)]
        return parsed, summary
    if setting == "redact":
        message = f"{sentence(summary)}: each is replaced by a placeholder (<EMAIL>, ...) before tokenizing"
    else:
        message = (
            f"sensitive data, trained on as it is: {sentence(summary)}; a model learns to say what its targets hold: "
            f"{ref('sensitive_data', 'redact')} replaces each with a placeholder, {ref('sensitive_data', 'refuse')} "
            "stops before planning"
        )
    parsed.warnings = [*parsed.warnings, Problem(found[0].line, SENSITIVE_DATA, message)]
    return parsed, summary
