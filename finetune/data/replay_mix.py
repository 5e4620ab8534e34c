"""Self-replay's data side (no torch): the shipped general prompts, the share of replay rows, the mixed files.

    prompts = training_prompts()                       # the shipped prompts minus the held-out slice
    ratio, reason = replay_ratio(config, params)       # "off" -> 0; "auto" -> rules/replay.py; a number as given
    mixed = write_mixed(config, folder, replay_rows)   # team conversations + replay rows: the files a run trains on

Replay rows are general requests answered by the base model itself (eval/replay.py generates and caches them)
or a team's own general conversations (`general_data`). They join the training side only: the team's
validation conversations are cut first, by the same rule and seed the data path uses (split.py), so the
validation loss stays the team's. Rows the base model answered are the product's own work: not billed (`billed_flags`),
their tokens shown beside the bill and counted in the time. A team's own general conversations are its data, which it
chose to train on: billed like its training file (rules/billing.py). The prompts file (prompts.jsonl beside this module, written by
examples/make_replay_prompts.py) must not overlap the retention check's general set (eval/general/), whole or
in part; tests/unit/data/test_replay_prompts.py holds it to that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from finetune.data.arrays import record_lengths
from finetune.data.combine import val_fraction
from finetune.data.convert import conversation_to_openai
from finetune.data.prepare import read_conversations
from finetune.data.redaction import redact_document
from finetune.data.sensitive import redacted
from finetune.data.split import split_conversations
from finetune.data.types import Conversation
from finetune.rules.replay import auto_replay
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import UserError
from finetune.settings.wording import ref

PROMPTS_FILE = Path(__file__).resolve().parent / "replay" / "prompts.jsonl"
OFF = "off"
HELD_OUT_EVERY = 8  # about one prompt in eight is kept back for a later general validation set
TRAIN_FILE, VAL_FILE, RECORD_FILE = "train.jsonl", "val.jsonl", "replay.json"
BASE_MODEL = "base model"  # Mixed.source of rows the base model answered (the product's own work: not billed)


@dataclass(frozen=True)
class ReplayPrompt:
    id: str
    kind: str
    text: str

    @property
    def held_out(self) -> bool:
        """Kept back from training (a later general validation set): a hash of the text decides, not its place."""
        return hashlib.sha256(("replay-held-out\0" + self.text).encode()).digest()[0] % HELD_OUT_EVERY == 0


@dataclass(frozen=True)
class Mixed:
    """What self-replay added to a run (plan.json's `replay_added`)."""

    config: RunConfig  # reads the mixed files
    ratio: float
    rows: int  # replay conversations added to training
    distinct_rows: int  # of them different (rows go round again when fewer answers than rows were found)
    team_rows: int  # the team's training conversations
    source: str  # "base model" or the general-data file
    generated: dict | None = None  # the base's answers the run read: from the cache or answered now, and the time

    @property
    def billed(self) -> bool:
        """The rows are the tenant's own general conversations (general_data), billed like its training file; rows
        the base model answered are the product's own work."""
        return self.source != BASE_MODEL

    def to_dict(self, tokens: int | None, tokens_processed: int | None) -> dict:
        """`tokens`: the replay rows' tokens in the mixed file; `tokens_processed`: those the run trains on (x epochs,
        cut like the run): billed when they are the tenant's own (`billed`), else the product's own work, shown in
        the plan and the time, not billed."""
        return {
            "ratio": self.ratio, "rows": self.rows, "distinct_rows": self.distinct_rows, "team_rows": self.team_rows,
            "tokens": tokens, "tokens_processed": tokens_processed, "source": self.source, "billed": self.billed,
            **({"generated": self.generated} if self.generated else {}),
        }  # fmt: skip


@cache
def replay_prompts(path: Path = PROMPTS_FILE) -> tuple[ReplayPrompt, ...]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        item = json.loads(line)
        rows.append(ReplayPrompt(str(item["id"]), str(item["kind"]), str(item["prompt"])))
        if not rows[-1].text.strip():
            raise UserError(f"{path}:{number}: an empty prompt")
    return tuple(rows)


def training_prompts() -> tuple[ReplayPrompt, ...]:
    return tuple(p for p in replay_prompts() if not p.held_out)


def held_out_prompts() -> tuple[ReplayPrompt, ...]:
    """The general validation slice: never trained on (ship/eval/replay.base_answers(..., held_out=True))."""
    return tuple(p for p in replay_prompts() if p.held_out)


def prompts_digest() -> str:
    return hashlib.sha256(PROMPTS_FILE.read_bytes()).hexdigest()


def replay_ratio(config: RunConfig, total_params: int | None = None) -> tuple[float, str | None]:
    """Replay rows per team training row (0: no replay), and Auto's reason when Auto chose it. `total_params`: the
    base model's size, which Auto's rule reads (rules/replay.py)."""
    if config.replay == OFF:
        return 0.0, None
    if not config.model and not config.general_data:  # a plan of the data alone: no base to answer the prompts
        if config.replay == AUTO:
            return 0.0, "off: no base model to answer the general prompts (a plan of the data alone)"
        raise UserError(f"{ref('replay')} has the base model answer general prompts: name the model, or give "
                        f"{ref('general_data')}")  # fmt: skip
    if config.replay == AUTO:
        choice = auto_replay(total_params, bool(config.general_data), config.objective)
        return choice.value, choice.reason
    return float(config.replay), None


def replay_on(config: RunConfig, total_params: int | None = None) -> bool:
    return replay_ratio(config, total_params)[0] > 0


def replay_count(ratio: float, team_rows: int) -> int:
    return max(1, round(ratio * team_rows)) if ratio > 0 and team_rows else 0


def pick(rows: list[dict], count: int, seed: int) -> list[dict]:
    """`count` rows drawn in a seeded order, going round again when more are asked for than there are."""
    if not rows or count <= 0:
        return []
    order = list(range(len(rows)))
    random.Random(f"replay-{seed}").shuffle(order)
    return [rows[order[i % len(order)]] for i in range(count)]


def team_split(config: RunConfig) -> tuple[list[Conversation], list[Conversation], list[dict]]:
    """The team's training and validation conversations, split as the data path would split them."""
    conversations, skipped = read_conversations(config.data, config.format, config.skip_invalid)
    if config.val_file:
        return conversations, [], skipped
    fraction, _ = val_fraction(config, len({c.key() for c in conversations}))
    split = split_conversations(conversations, fraction, config.seed)
    return split.train, split.val, skipped


def general_rows(path: str) -> list[dict]:
    """A team's own general conversations (`general_data`), as chat rows."""
    conversations, _ = read_conversations(path)
    if not conversations:
        raise UserError(f"{path}: no conversation in {ref('general_data')}")
    return [conversation_to_openai(c) for c in conversations]


def write_mixed(
    config: RunConfig, folder: Path, replay_rows: list[dict], ratio: float, source: str, write: bool = True,
    count: int | None = None,
) -> Mixed:  # fmt: skip
    """Write FOLDER/train.jsonl (the team's training conversations, then `count` replay rows: by default `ratio` per
    team row) and, unless a validation file is given, FOLDER/val.jsonl (the team's validation conversations); the
    config reading them."""
    train, val, _ = team_split(config)
    chosen = pick(replay_rows, replay_count(ratio, len(train)) if count is None else count, config.seed)
    changes: dict = {"data": str(folder / TRAIN_FILE), "format": "chat"}
    if not config.val_file:  # the team's validation conversations, as the data path would have cut them
        changes |= {"val_file": str(folder / VAL_FILE), "val_fraction": AUTO} if val else {"val_fraction": 0.0}
    if write:
        folder.mkdir(parents=True, exist_ok=True)
        redact = config.sensitive_data == "redact"  # the copies hold placeholders, as the tokens will
        _write(folder / TRAIN_FILE, [conversation_to_openai(c) for c in _as_trained(train, redact)] + chosen, redact)
        if val:
            _write(folder / VAL_FILE, [conversation_to_openai(c) for c in _as_trained(val, redact)], redact)
        record = {"source_data": config.data, "ratio": ratio, "rows": len(chosen), "team_rows": len(train),
                  "team_lines": [c.line for c in train]}  # fmt: skip  # row i of the mix is that line of source_data
        (folder / RECORD_FILE).write_text(json.dumps(record | {"from": source}, indent=2), encoding="utf-8")
    distinct = len({json.dumps(row, sort_keys=True) for row in chosen})
    return Mixed(dataclasses.replace(config, **changes), ratio, len(chosen), distinct, len(train), source)


def _as_trained(conversations: list[Conversation], redact: bool) -> list[Conversation]:
    """The conversations as the tokens will hold them: with redact, their values replaced where the reader found them
    (a number in a tool call's arguments, an address split over content parts), before they are written out."""
    return redacted(conversations) if redact else conversations


def replay_tokens(records, team_rows: int) -> int:
    """Tokens of the replay records among prepared training records (they come after the team's rows)."""
    if hasattr(records, "line"):
        return int(records.lengths[records.line > team_rows].sum())
    return sum(len(r.input_ids) for r in records if r.line > team_rows)


def unbilled_after(replay_added: dict | None) -> int | None:
    """The team's rows of a mixed file whose later rows the base model answered (not billed): plan.json's
    `replay_added`; None when every row is billed (no replay, or the tenant's own general conversations)."""
    if not replay_added or replay_added.get("billed", True):
        return None
    return replay_added.get("team_rows")


def team_flags(records, team_rows: int | None) -> list[bool] | None:
    """Per training record, whether it is one of the team's (its line among the mixed file's first `team_rows`);
    None (all of them) without replay."""
    if team_rows is None:
        return None
    lines = records.line.tolist() if hasattr(records, "line") else [r.line for r in records]
    return [line <= team_rows for line in lines]


def billed_flags(records, replay_added: dict | None) -> list[bool] | None:
    """Per training record, whether its tokens are billed (what the training loop counts, record by record): all of
    them (None) but the rows the base model answered."""
    return team_flags(records, unbilled_after(replay_added))


def billed_lengths(records, flags: list[bool] | None) -> list[int]:
    """Each training record's tokens as billed: its tokens, or 0 where `flags` says it is not billed."""
    lengths = record_lengths(records)
    return (
        lengths if flags is None else [length if billed else 0 for length, billed in zip(lengths, flags, strict=True)]
    )


def _write(path: Path, rows: list[dict], redact: bool = False) -> None:
    rows = [redact_document(row) for row in rows] if redact else rows
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)
