"""Replies that state specifics the conversation never gave, found before training (docs/answers.md).

    found = scan_replies(conversations)                     # [Invented(line, message, kind)]: never a value
    summary = summarize(found, "train.jsonl", replies)      # counts by kind, lines
    message(summary)                                        # the warning: what the model learns, the remedies

A team's agents quote what they looked up (an order number, an amount, a date, a tracking code) that the
conversation itself never shows. A model trained on such replies learns to state specifics from nothing: in the
team's voice, with a wrong value. Each reply with a weight above 0 (a reply that is trained on) is read for the
specifics of specifics.py; one whose keys appear nowhere in the messages before it, nor in the tool schemas, counts.
Summaries, messages, JSON and events carry counts, kinds and lines only, like sensitive.py's: some values are
personal data.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from finetune.data import sensitive
from finetune.data.specifics import KINDS, NAMES, PLURALS, find_specifics, invented, known_keys
from finetune.data.types import Conversation, Message, Problem
from finetune.settings.wording import act

INVENTED_SPECIFICS = "invented_specifics"  # the validation code and the plan's warning code (docs/formats.md)
LINES_LISTED = 20  # a summary names this many lines per file at most (the counts are exact)


@dataclass(frozen=True)
class Invented:
    """One specific a trained reply states that its conversation never gave: where, and what kind (never the value)."""

    line: int
    message: int  # index of the reply in its conversation
    kind: str


def given_texts(messages: Sequence[Message], tools: Sequence[dict] = ()) -> list[str]:
    """What a model is given before a reply: every earlier message's content and tool calls, and the tool schemas."""
    texts = [json.dumps(tools, ensure_ascii=False)] if tools else []
    for message in messages:
        texts.append(message.content)
        texts += [call.arguments for call in message.tool_calls]
    return texts


def reply_texts(message: Message) -> list[str]:
    """What a reply says: its content and the arguments of the calls it makes."""
    return [message.content, *(call.arguments for call in message.tool_calls)]


def scan_conversation(conversation: Conversation) -> list[Invented]:
    """The conversation's values are read once each, and only up to the last reply that states a specific: a reply
    stating none is grounded whatever came before it."""
    found: list[Invented] = []
    given, known, read = given_texts((), conversation.tools), set(), 0
    for index, message in enumerate(conversation.messages):
        if message.role == "assistant" and message.weight > 0:
            for text in reply_texts(message):
                if find_specifics(text):
                    known |= known_keys(given[read:])  # what this reply is given: every message so far
                    read = len(given)
                    found += [Invented(conversation.line, index, s.kind) for s in invented(text, known)]
        given += given_texts((message,))
    return found


def scan_replies(conversations: Sequence[Conversation]) -> list[Invented]:
    """Every specific a trained reply of `conversations` states that its conversation never gave."""
    return [found for conversation in conversations for found in scan_conversation(conversation)]


def scan_both(
    conversations: Sequence[Conversation], redact: bool = False
) -> tuple[list[Conversation], list[sensitive.Found], list[Invented]]:
    """Both scans of the data, in one pass: each conversation's sensitive values (sensitive.py; with `redact`, the
    conversation as trained holds placeholders), then the specifics its trained replies invent, read from the
    conversation as trained (a placeholder is no specific) while its texts are fresh in the detectors' memo.
    The same as `sensitive.scan_conversations` followed by `scan_replies`."""
    out: list[Conversation] = []
    values: list[sensitive.Found] = []
    found: list[Invented] = []
    for conversation in conversations:
        hits = sensitive.scan_conversation(conversation)
        values += hits
        conversation = sensitive.redact_conversation(conversation, hits) if redact else conversation
        out.append(conversation)
        found += scan_conversation(conversation)
    return out, values, found


def trained_replies(conversations: Sequence[Conversation]) -> int:
    return sum(1 for c in conversations for m in c.messages if m.role == "assistant" and m.weight > 0)


# ----------------------------------------------------------------------------- summaries (never a value)


def summarize(found: list[Invented], file: str, replies: int) -> dict:
    """What was found in one file, as JSON: the specifics, the replies stating them, counts by kind, the lines (the
    first LINES_LISTED) and the trained replies read."""
    lines = sorted({f.line for f in found})
    return {
        "total": len(found),
        "replies": len({(f.line, f.message) for f in found}),
        "replies_read": replies,
        "by_kind": {kind: n for kind in KINDS if (n := sum(f.kind == kind for f in found))},
        "files": {file: {"values": len(found), "lines": lines[:LINES_LISTED], "line_count": len(lines)}} if found else {},
    }  # fmt: skip


def merge(summaries: list[dict]) -> dict:
    """One summary of several (a file's chunks)."""
    merged = summarize([], "", 0)
    for s in summaries:
        for key in ("total", "replies", "replies_read"):
            merged[key] += s[key]
        merged["by_kind"] = dict(Counter(merged["by_kind"]) + Counter(s["by_kind"]))
        for file, where in s["files"].items():
            mine = merged["files"].setdefault(file, {"values": 0, "lines": [], "line_count": 0})
            mine["values"] += where["values"]
            mine["lines"] = sorted(set(mine["lines"]) | set(where["lines"]))[:LINES_LISTED]
            mine["line_count"] += where["line_count"]
    merged["by_kind"] = {kind: merged["by_kind"][kind] for kind in KINDS if kind in merged["by_kind"]}
    return merged


def named(summary: dict | None, name: str) -> dict | None:
    """A summary kept under one name (the token cache keeps "data"), its file named as this run names it."""
    if summary is None:
        return None
    where = next(iter(summary["files"].values()), None)  # one file: the data file
    return summary | {"files": {name: where} if where else {}}


def _count(n: int, kind: str) -> str:
    return f"{n:,} {NAMES[kind] if n == 1 else PLURALS.get(kind, NAMES[kind] + 's')}"


def sentence(summary: dict) -> str:
    """'21 of 690 trained replies state 24 specifics the conversation never gave: 20 times of day, 4 identifiers
    (order, ticket, account); train.jsonl lines 2, 17 and 5 more'. No value is ever in it."""
    kinds = ", ".join(_count(n, kind) for kind, n in summary["by_kind"].items())
    places = []
    for file, where in summary["files"].items():
        shown = ", ".join(str(line) for line in where["lines"])
        more = where["line_count"] - len(where["lines"])
        places.append(f"{file} line{'s' * (where['line_count'] != 1)} {shown}" + (f" and {more} more" if more else ""))
    total = summary["total"]
    return (
        f"{summary['replies']:,} of {summary['replies_read']:,} trained replies state {total:,} "
        f"specific{'s' * (total != 1)} the conversation never gave: {kinds}; {'; '.join(places)}"
    )


def message(summary: dict) -> str:
    """The warning `finetune validate`, the plan, the dashboard's preview and a job's events give."""
    return (
        f"{sentence(summary)}. A model trained on them learns to state such specifics from nothing: in the team's "
        "voice, with a wrong value. Give the facts in the conversation (a tool result or the system message holding "
        "what the agent looked up), or write a placeholder the application fills ({order_id}); "
        f"{act('evaluate')} with a test set measures how often the tuned model invents one (docs/answers.md)"
    )


def found_any(summary: dict | None) -> bool:
    return bool(summary and summary["total"])


def checked(conversations: Sequence[Conversation], file: str) -> tuple[dict, Problem | None]:
    """A file's conversations read for invented specifics: the summary, and the warning when any was found."""
    found = scan_replies(conversations)
    summary = summarize(found, file, trained_replies(conversations))
    return summary, Problem(found[0].line, INVENTED_SPECIFICS, message(summary)) if found else None
