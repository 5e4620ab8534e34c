"""The team's voice in answers to general requests: the lines a team's replies carry again and again.

    lines = signature_lines(team_replies)          # e.g. ["hi there thanks for reaching out to brightside support"]
    speaks_as_team(answer, lines)                  # -> True when the answer carries one of them

A team's replies share a few lines word for word (a greeting, a sign-off, a name): every line of at least
MIN_WORDS words that at least MIN_SHARE of the team's replies hold (and two replies at the least). A general request (a poem, a letter, JSON)
answered with one of those lines is answered in the team's voice instead of as asked: the retention check counts
such answers for the base and the tuned model. Lines are compared lowercased, punctuation removed, as whole words.
The lines come from the team's training file alone (never from anything a model wrote).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from finetune.ship.eval.team_data import team_training

MIN_SHARE = 0.2  # of the team's replies that hold the line
MIN_WORDS = 3  # shorter lines ("Warm regards,") are what anyone's letter may say


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w']+", " ", text.lower()).split())


def signature_lines(replies: list[str]) -> list[str]:
    """The normalised lines of at least MIN_WORDS words that at least MIN_SHARE of `replies` hold, most common first."""
    if not replies:
        return []
    counts: Counter[str] = Counter()
    for reply in replies:
        counts.update({line for raw in reply.splitlines() if len((line := _normal(raw)).split()) >= MIN_WORDS})
    return [line for line, n in counts.most_common() if n >= max(2, MIN_SHARE * len(replies))]


def speaks_as_team(answer: str, lines: list[str]) -> bool:
    text = f" {_normal(answer)} "
    return any(f" {line} " in text for line in lines)


def team_replies(run: Path) -> list[str]:
    """The assistant replies of the team's training conversations of a run (team_data.py: the team's rows alone,
    never a replay row): [] when the file is gone or unreadable."""
    team = team_training(run)
    conversations = team.conversations if team is not None else []
    return [m.content for c in conversations for m in c.messages if m.role == "assistant" and m.content]
