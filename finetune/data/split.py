"""Train/validation split by whole conversation, deterministic from a seed.

Exact duplicates are grouped first, so a conversation and its copies always land on the same side.
Each group is ranked by a hash of (seed, conversation): which conversations are held out does not
depend on the order of the file, and adding data moves few of them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from finetune.data.types import Conversation

# Auto validation fraction: enough conversations for a usable signal, capped so training keeps most data
MIN_CONVERSATIONS_FOR_VALIDATION = 20
TARGET_VAL_CONVERSATIONS = 30
MIN_FRACTION, MAX_FRACTION = 0.05, 0.2
MAX_VAL_CONVERSATIONS = 1000


@dataclass(frozen=True)
class Split:
    train: list[Conversation]
    val: list[Conversation]
    duplicates_removed: int  # validation conversations dropped because they duplicate a training one


def auto_val_fraction(conversations: int) -> tuple[float, str]:
    """The validation fraction Auto picks for a file of this many (unique) conversations, with its reason."""
    if conversations < MIN_CONVERSATIONS_FOR_VALIDATION:
        return 0.0, (
            f"only {conversations} conversations: too few to hold any out without starving training "
            f"(validation turns on from {MIN_CONVERSATIONS_FOR_VALIDATION})"
        )
    fraction = min(MAX_FRACTION, max(MIN_FRACTION, TARGET_VAL_CONVERSATIONS / conversations))
    fraction = min(fraction, MAX_VAL_CONVERSATIONS / conversations)
    return round(fraction, 4), (
        f"{conversations} conversations: hold out about {round(fraction * conversations)} "
        f"({fraction:.0%}; aim for {TARGET_VAL_CONVERSATIONS}+ held out, between {MIN_FRACTION:.0%} and "
        f"{MAX_FRACTION:.0%}, at most {MAX_VAL_CONVERSATIONS})"
    )


def _rank(seed: int, conversation: Conversation) -> str:
    payload = json.dumps([seed, conversation.key()], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def split_conversations(conversations: list[Conversation], fraction: float, seed: int) -> Split:
    """Hold out `fraction` of the unique conversations (rounded, at least one when fraction > 0)."""
    groups: dict[tuple, list[Conversation]] = {}
    for conversation in conversations:
        groups.setdefault(conversation.key(), []).append(conversation)
    if fraction <= 0 or len(groups) < 2:
        return Split(list(conversations), [], 0)
    n_val = min(len(groups) - 1, max(1, round(fraction * len(groups))))
    ranked = sorted(groups, key=lambda key: _rank(seed, groups[key][0]))
    held_out = set(ranked[:n_val])
    train = [c for c in conversations if c.key() not in held_out]
    val = [c for c in conversations if c.key() in held_out]
    return Split(train, val, 0)


def remove_overlap(train: list[Conversation], val: list[Conversation]) -> Split:
    """For a user-given validation file: drop validation conversations that also appear in training."""
    seen = {c.key() for c in train}
    kept = [c for c in val if c.key() not in seen]
    return Split(train, kept, len(val) - len(kept))
