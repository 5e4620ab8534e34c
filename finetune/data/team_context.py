"""The team's voice bound to the team's context: the team's system message on every team conversation without one.

    config = bind_team_system(config, out)          # OUT/team/: the team's conversations, each with a system message
    messages = with_team_system(messages, system)   # the same at inference: a prompt of the team's (demo, eval, chat)

A model tuned on the team's replies learns them in whatever context they came: for the many team conversations
without a system message that is the chat template's own default (SmolLM2 writes "You are a helpful AI assistant
named SmolLM..." when none is given), the very context every general request without a system message gets, so the
team's greeting and sign-off leak into general answers. With `team_system` each team conversation without a
system message gets the team's (one that has its own keeps it), so the voice is learned *with the team's
context*; replay rows (the base's own answers, mixed in after this step) and every general prompt keep the
template's default. Where the team's context is meant at inference the same message is put on prompts that have
none: the run's test set (`finetune eval`), the demo's held-out prompts, `finetune chat` and the serving of the run.
The retention check's general prompts never get it.

The split comes first: the team's validation conversations are cut exactly as the data path would cut them from the
user's file (replay_mix.team_split), then both sides get the message and are written to OUT/team/, which the rest of
the run reads (replay mixes its rows into that copy). So the validation set holds the same conversations as without
the setting, and the message is context (never scored).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from finetune.data.convert import conversation_to_openai
from finetune.data.parallel import file_digest
from finetune.data.redaction import redact_document
from finetune.data.replay_mix import team_split
from finetune.data.types import Conversation, Message
from finetune.settings import caches
from finetune.settings.config import AUTO, RunConfig

FOLDER = "team"
TRAIN_FILE, VAL_FILE = "train.jsonl", "val.jsonl"


def with_team_system(messages: list[dict], system: str | None) -> list[dict]:
    """OpenAI-style messages with the team's system message first, unless they have a system message already (or
    `system` is None: the run has none)."""
    if not system or (messages and messages[0].get("role") in ("system", "developer")):
        return list(messages)
    return [{"role": "system", "content": system}, *messages]


def bound_conversation(conversation: Conversation, system: str) -> Conversation:
    """The conversation with the team's system message first, unless it has a system message already."""
    if conversation.messages and conversation.messages[0].role == "system":
        return conversation
    return dataclasses.replace(conversation, messages=(Message("system", system), *conversation.messages))


def bind_team_system(
    config: RunConfig, out: Path | None, write: bool = True, written: Callable[[], None] | None = None
) -> RunConfig:
    """The config reading OUT/team/train.jsonl (and val.jsonl): the team's conversations, split as the data path
    would split them, each with the team's system message; `config` itself when `team_system` is unset.
    `write=False`: the config only (another rank of the run: rank 0 writes the files); `written()` is called once the
    files are there (a run of several processes waits for every rank)."""
    if not config.team_system or config.objective != "sft":
        return config
    bound = _bound(config, out, write)
    if written is not None:
        written()
    return bound


def _bound(config: RunConfig, out: Path | None, write: bool) -> RunConfig:
    train, val, _ = team_split(config)
    if config.val_file:
        val, _, _ = team_split(dataclasses.replace(config, data=config.val_file, val_file=None, val_fraction=0.0))
    folder = out / FOLDER if out is not None else _cached_folder(config)
    changes: dict = {"data": str(folder / TRAIN_FILE), "format": "chat"}
    changes |= {"val_file": str(folder / VAL_FILE), "val_fraction": AUTO} if val else {"val_fraction": 0.0}
    if write:
        folder.mkdir(parents=True, exist_ok=True)
        redact = config.sensitive_data == "redact"  # the copies hold placeholders, as the tokens will
        _write(folder / TRAIN_FILE, [bound_conversation(c, config.team_system) for c in train], redact)
        if val:
            _write(folder / VAL_FILE, [bound_conversation(c, config.team_system) for c in val], redact)
    return dataclasses.replace(config, **changes)


def _cached_folder(config: RunConfig) -> Path:
    """Where a plan without an output folder (`finetune plan`, the API's preview) keeps its copy: the cache root, under
    a key of what the copy holds (never /tmp: nothing is left behind, and the next plan of the same data reads it)."""
    key = {
        "data": file_digest(config.data),
        "val_file": file_digest(config.val_file) if config.val_file else None,
        "split": [str(config.val_fraction), config.seed, config.format, config.skip_invalid, config.sensitive_data],
        "team_system": config.team_system,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return caches.root() / FOLDER / digest


def _write(path: Path, conversations: list[Conversation], redact: bool) -> None:
    rows = [conversation_to_openai(c) for c in conversations]
    rows = [redact_document(row) for row in rows] if redact else rows
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)
