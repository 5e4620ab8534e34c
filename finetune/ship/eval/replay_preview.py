"""Self-replay in the plan: what a run mixed in, or, for a plan that trains nothing, its rows, tokens and the base's
time counted with nothing generated.

    pending = pending_replay(config, tokenizer, total_params)     # None when replay is off
    summary, lengths, billed, team = pending.counted(summary, team_lengths, config)
    plan.json's replay_added = pending.to_dict(tokens, tokens_processed)   # with "pending": what training will answer

A plan made without an output folder (`finetune plan`, the API's plan, the dashboard's preview) loads no model and
writes nothing: the base answers the replay prompts when training starts (`finetune train`, a service worker preparing
the job), its estimate logged first and a line per batch while it runs (ship/eval/replay.py). Without the answers the
plan is still exact where the steps are concerned: the run mixes in exactly `replay_count(ratio, team rows it reads)`
rows (the base answers until it has that many finished answers; `pick` goes round again when the prompts run out), one
training record each, so the records and the steps counted here are the run's. The tokens of an answer the base gave
before (the replay cache) are its own; an answer not given yet is counted at the MAX_NEW_TOKENS cap, the most it can be
(so the tokens trained and the time are at most the plan's). `finetune train --plan` of such a plan completes it
(`as_given`, then run.py plans again with the answers, Auto choosing again).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import numpy as np

from finetune.data import replay_mix
from finetune.data.parallel import file_digest
from finetune.data.prepare import read_conversations
from finetune.data.records import build_records
from finetune.data.seq_len import choose_max_seq_len
from finetune.data.tokenize import ChatTokenizer
from finetune.data.types import Conversation, DataSummary, Message
from finetune.plan.plan import Plan
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import UserError
from finetune.settings.registry import settings


@dataclass(frozen=True)
class PendingReplay:
    """What self-replay will add to the run, counted before the base answers (`mix_replay` makes the rows)."""

    ratio: float
    rows: int  # replay rows (conversations) the run mixes in
    team_rows: int  # the team's training conversations
    source: str  # "base model" or the general-data file
    record_tokens: tuple[int, ...]  # each of their records' tokens: its own when its answer is known, else at the cap
    record_targets: int  # of them scored (the answers)
    messages: int  # in the rows
    distinct_rows: int
    to_answer: int  # prompts the base answers when training starts (0: every answer the rows need is cached)
    from_cache: int  # answers the rows read from the cache
    estimated_s: float | None  # the base's time for `to_answer` at most (None: the model's size is unknown)

    @property
    def billed(self) -> bool:
        """The rows are the tenant's own general conversations (billed like its file; rules/billing.py)."""
        return self.source != replay_mix.BASE_MODEL

    def counted(
        self, summary: DataSummary, lengths: list[int], config: RunConfig
    ) -> tuple[DataSummary, list[int], list[int], int]:
        """The data as the run will read it (the team's records, then the replay rows'), each record's tokens, each
        record's tokens as billed (a replay record's 0), and the team's records."""
        limit, reason = summary.max_seq_len, summary.max_seq_len_reason
        if config.max_seq_len == AUTO and self.record_tokens:  # Auto's limit from every record, the rows' among them
            choice = choose_max_seq_len(config, np.array([*lengths, *self.record_tokens], dtype=np.int64))
            limit, reason = choice.value, choice.reason
        added = [min(tokens, limit) if limit else tokens for tokens in self.record_tokens]
        summary = dataclasses.replace(
            summary,
            examples=summary.examples + len(added),
            conversations=(summary.conversations or 0) + self.rows,
            messages=(summary.messages or 0) + self.messages,
            tokens_in_file=(summary.tokens_in_file or 0) + sum(added),
            target_tokens=(summary.target_tokens or 0) + self.record_targets,
            context_tokens=(summary.context_tokens or 0) + sum(added) - self.record_targets,
            max_record_tokens=max([summary.max_record_tokens or 0, *added]),
            max_seq_len=limit,
            max_seq_len_reason=reason,
        )
        return summary, [*lengths, *added], [*lengths, *([0] * len(added))], len(lengths)

    def to_dict(self, tokens: int | None, tokens_processed: int | None) -> dict:
        """plan.json's replay_added, as a run's (replay_mix.Mixed.to_dict) with `pending`: what is not known yet."""
        return {
            "ratio": self.ratio, "rows": self.rows, "distinct_rows": self.distinct_rows, "team_rows": self.team_rows,
            "tokens": tokens, "tokens_processed": tokens_processed, "source": self.source, "billed": self.billed,
            "pending": {"prompts": self.to_answer, "from_cache": self.from_cache, "estimated_s": self.estimated_s,
                        "tokens": "answers not given yet counted at the cap"},
        }  # fmt: skip


def pending_replay(config: RunConfig, tokenizer, total_params: int | None) -> PendingReplay | None:
    """The replay rows a run of `config` mixes in, counted without generating; None when replay is off."""
    ratio, _ = replay_mix.replay_ratio(config, total_params)
    if ratio <= 0:
        return None
    from finetune.ship.eval import replay  # torch: replay.py loads the base to answer; here only its cache is read

    train, _, _ = replay_mix.team_split(config)
    needed = replay_mix.replay_count(ratio, replay.rows_read(config, len(train)))
    records = Records(ChatTokenizer(tokenizer), config.record_policy, replay.MAX_NEW_TOKENS)
    if config.general_data:
        general, _ = read_conversations(config.general_data)
        rows = replay_mix.pick(general, needed, config.seed)  # the rows write_mixed picks (the same seeded order)
        tokens, targets = records.of(rows)
        distinct = len({row.key() for row in rows})
        messages = sum(len(row.messages) for row in rows)
        return PendingReplay(ratio, needed, len(train), str(config.general_data), tokens, targets, messages, distinct,
                             0, 0, 0.0)  # fmt: skip
    order = [p.text for p in replay_mix.training_prompts()]
    random.Random(f"replay-{config.seed}").shuffle(order)  # the order mix_replay asks them in
    cached = replay.cached_answers(config, tokenizer)
    found, to_answer = [], []
    for start in range(0, len(order), replay.CHUNK):  # as answer_prompts asks: a chunk at a time, until enough
        if len(found) >= needed:
            break
        for prompt in order[start : start + replay.CHUNK]:
            if prompt not in cached:
                to_answer.append(prompt)  # counted as if it finishes: the run goes on until it has enough that do
            if cached.get(prompt, "") is not None:
                found.append((prompt, cached.get(prompt)))
    chosen = replay_mix.pick(found, needed, config.seed)
    tokens, targets = records.of([answer_row(prompt, answer) for prompt, answer in chosen])
    seconds = replay.generation_estimate(config, tokenizer, to_answer)
    from_cache = sum(1 for _, answer in set(chosen) if answer is not None)
    return PendingReplay(ratio, needed, len(train), "base model", tokens, targets, 2 * needed, len(set(chosen)),
                         len(to_answer), from_cache, seconds)  # fmt: skip


@dataclass(frozen=True)
class Records:
    """Conversations' training records tokenized as the data path tokenizes them, for their lengths: an answer not
    given yet (None) stands at the `cap` (the tokens of a one-token placeholder, then cap - 1 more)."""

    chat: ChatTokenizer
    policy: str
    cap: int

    def of(self, conversations: list[Conversation]) -> tuple[tuple[int, ...], int]:
        """Each record's tokens, and the records' scored tokens in all."""
        tokens, targets = [], 0
        for conversation in conversations:
            pending = any(m.content is None for m in conversation.messages)
            if pending:  # the cap's worth of answer: a placeholder of one token, and the rest counted
                conversation = dataclasses.replace(conversation, messages=tuple(
                    dataclasses.replace(m, content=PLACEHOLDER) if m.content is None else m
                    for m in conversation.messages))  # fmt: skip
            for record in build_records(conversation, 0, self.policy):
                outcome = self.chat.tokenize_whole(record)
                more = self.cap - len(self.chat.encode(PLACEHOLDER)) if pending else 0
                tokens.append(outcome.total_tokens + more)
                targets += int((outcome.weights > 0).sum()) + more
        return tuple(tokens), targets


PLACEHOLDER = "."


def answer_row(prompt: str, answer: str | None) -> Conversation:
    """A prompt and the base's answer to it (None: not given yet), as a conversation of the data path."""
    return Conversation((Message("user", prompt), Message("assistant", answer)), 0)  # type: ignore[arg-type]


def with_replay(
    plan: Plan, mixed, config: RunConfig, total_params: int | None, team_tokens: int, replay_trained: int | None = None
) -> Plan:
    """The plan records what replay added (rows, their tokens trained on, `replay_trained` when counted from the
    records; billed when they are the tenant's own: `mixed` a run's Mixed or a PendingReplay) and Auto's ratio or why
    Auto left it off."""
    _, reason = replay_mix.replay_ratio(config, total_params)
    auto = {**plan.auto, "replay": reason} if reason else plan.auto
    if mixed is None:
        return dataclasses.replace(plan, auto=auto)
    in_file = plan.data.tokens_in_file - team_tokens if plan.data.tokens_in_file is not None else None
    trained = replay_trained
    if trained is None and plan.tokens_trained is not None and not mixed.billed:
        trained = plan.tokens_trained - plan.tokens_processed
    return dataclasses.replace(plan, replay_added=mixed.to_dict(in_file, trained), auto=auto)


def is_pending(plan: Plan) -> bool:
    """Whether the plan counted replay rows the base has not answered yet (a plan made without an output folder)."""
    return bool((plan.replay_added or {}).get("pending"))


def as_given(plan: Plan, config: RunConfig) -> RunConfig:
    """The settings a pending plan was made from: its own, with every value Auto chose given back to Auto (the data
    with the replay rows may move a choice: the record length limit follows their lengths), and the run's `out`,
    `resume` and `allow_changes` from `config`. Refused when the training file changed since."""
    if plan.data.data_sha256 != file_digest(plan.run.data):
        raise UserError("the training file changed since the plan was made: plan the run again")
    chosen = {spec.name: AUTO for spec in settings() if spec.plan_key in plan.auto and spec.auto}
    return dataclasses.replace(
        plan.run, **chosen, out=config.out, resume=config.resume, allow_changes=config.allow_changes
    )
