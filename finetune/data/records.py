"""Conversation -> training records, by a named policy (see RecordPolicy)."""

from __future__ import annotations

from finetune.data.types import Conversation, Record, RecordPolicy


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
