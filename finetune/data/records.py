"""Conversation -> training records, by a named policy (see RecordPolicy); an over-long record -> records that fit.

    records = build_records(conversation, index, "all")      # one record, every weighted reply a target
    parts = fit_record(record, 1024, measure)                 # over the limit: consecutive records that fit

`fit_record` splits at turn boundaries: a turn is a user message and everything up to the next one (the
replies, tool calls and their results), so a tool result always stays with its call and no record starts
with an orphan tool message. Each part scores a consecutive group of the record's targets, every target in
exactly one part, and carries the system message plus as many of the most recent earlier turns as fit.
"""

from __future__ import annotations

from collections.abc import Callable

from finetune.data.types import Conversation, Record
from finetune.settings.data_choices import RecordPolicy

SYSTEM_ROLES = ("system", "developer")


def target_indices(conversation: Conversation) -> list[int]:
    """Assistant messages with weight > 0: the replies the team chose to teach."""
    return [i for i, m in enumerate(conversation.messages) if m.role == "assistant" and m.weight > 0]


def build_records(conversation: Conversation, index: int, policy: RecordPolicy | str) -> list[Record]:
    """The records one conversation yields; none when it has nothing to learn."""
    policy = RecordPolicy(policy)
    targets = target_indices(conversation)
    if not targets:
        return []
    messages = conversation.messages
    if policy is RecordPolicy.ALL:
        return [Record(messages, tuple(targets), index, conversation.line, conversation.tools)]
    if policy is RecordPolicy.LAST:
        last = targets[-1]
        return [Record(messages[: last + 1], (last,), index, conversation.line, conversation.tools)]
    # EACH: every target turn gets its own record that ends with it; earlier replies are context
    return [Record(messages[: t + 1], (t,), index, conversation.line, conversation.tools) for t in targets]


def fit_record(record: Record, max_len: int, measure: Callable[[Record], int]) -> list[Record]:
    """The consecutive records an over-long `record` becomes: each scores a group of its targets (in order,
    each target once) and carries as much earlier context as fits in `max_len` tokens, by whole turns.

    `measure(record)` is a record's length in tokens (exact, or estimated). The greedy takes as many targets
    per part as fit, then as many earlier turns as fit. A part whose single target does not fit even with
    no earlier turn (the reply and the turn that prompts it) is returned as it is, over the limit: the
    caller cuts its context from the left or drops it, as for any record.
    """
    messages = record.messages
    head = 1 if messages and messages[0].role in SYSTEM_ROLES else 0  # the system message opens every part
    # where a turn begins: each user message (and the first message after the system one, whatever it is)
    starts = sorted({head, *(i for i in range(head, len(messages)) if messages[i].role == "user")})

    def part(start: int, targets: list[int]) -> Record:
        shift = start - head
        kept = messages[:head] + messages[start : targets[-1] + 1]
        return Record(kept, tuple(t - shift for t in targets), record.conversation, record.line, record.tools)

    def fits(start: int, targets: list[int]) -> bool:
        return measure(part(start, targets)) <= max_len

    parts: list[Record] = []
    targets = list(record.targets)
    first = 0
    while first < len(targets):
        turn = max(k for k, s in enumerate(starts) if s <= targets[first])  # the turn of the group's first target
        end = first + 1
        if fits(starts[turn], targets[first:end]):
            while end < len(targets) and fits(starts[turn], targets[first : end + 1]):
                end += 1
            while turn > 0 and fits(starts[turn - 1], targets[first:end]):
                turn -= 1
        parts.append(part(starts[turn], targets[first:end]))
        first = end
    return parts
