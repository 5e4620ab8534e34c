"""The team's own training conversations of a run, named by the team's file and its lines: the one reader of "the
team's replies" (issue 47), for the recitation check (grounding.py) and the team's voice (team_voice.py).

    team = team_training(run)       # TeamTraining(conversations, file) or None when the data is not at hand
    team.conversations[0].line      # the line of the team's file, as the team gave it

A run may train on copies: the test split's OUT/train.jsonl (the file less its held-out lines) and the replay mix
(OUT/replay/train.jsonl: the team's training conversations first, then the replay rows: the base model's answers, or
the team's general conversations). Only the team's rows are read, never a replay row, and each is named by the file
the team gave and its line there, never by a line of a copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from finetune.data.read import read_file
from finetune.data.replay_mix import RECORD_FILE as REPLAY_RECORD
from finetune.data.types import Conversation
from finetune.settings.errors import UserError
from finetune.ship.run_folder import read_json

SPLIT_RECORD = "test_split.json"  # eval/test_split.py's RECORD_FILE (that module reads the data path: torch-free too)


@dataclass(frozen=True)
class TeamTraining:
    conversations: list[Conversation]  # each with its line in `file`
    file: str  # the name of the file the team gave


def team_training(run: str | Path) -> TeamTraining | None:
    """The team's training conversations a run trained on (its plan names the file), or None when that file is gone
    or unreadable."""
    run = Path(run)
    plan = read_json(run / "plan.json")
    data = (plan.get("settings") or {}).get("data")
    try:
        conversations = read_file(data).conversations if data and Path(data).is_file() else None
    except (OSError, UserError):
        conversations = None
    if not conversations:
        return None
    added = plan.get("replay_added") or {}
    if added.get("team_rows") is not None:  # the mix: the team's rows first, named by the file the mix was made from
        record = read_json(Path(data).parent / REPLAY_RECORD)
        conversations = _renamed(conversations[: added["team_rows"]], record.get("team_lines"))
        data = record.get("source_data", data)
    split = read_json(run / SPLIT_RECORD)
    if split.get("source") and Path(data).resolve() == (run / "train.jsonl").resolve():  # the test split's copy
        conversations = _renamed(conversations, _kept_lines(split, max(c.line for c in conversations)))
        data = split["source"]
    return TeamTraining(conversations, Path(data).name)


def _renamed(conversations: list[Conversation], lines: list[int] | None) -> list[Conversation]:
    """Each conversation named by `lines[its line - 1]` (a copy's line -> the line it was copied from)."""
    if not lines:  # a run older than the record of its lines: the copy's own
        return conversations
    return [dataclasses.replace(c, line=lines[c.line - 1]) for c in conversations if c.line <= len(lines)]


def _kept_lines(split: dict, count: int) -> list[int]:
    """The file's lines the test split's OUT/train.jsonl holds, in order (its line k is the k-th of them)."""
    held, kept, line = set(split.get("lines") or []), [], 0
    while len(kept) < count:
        line += 1
        if line not in held:
            kept.append(line)
    return kept
