"""Self-replay counted for a plan that trains nothing: its rows, tokens and the base's time, nothing generated.

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
from finetune.data.prompting import prompt_ids
from finetune.data.seq_len import choose_max_seq_len
from finetune.data.types import DataSummary
from finetune.plan.plan import Plan
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import UserError
from finetune.settings.registry import settings


@dataclass(frozen=True)
class PendingReplay:
    """What self-replay will add to the run, counted before the base answers (`mix_replay` makes the rows)."""

    ratio: float
    rows: int  # replay rows the run mixes in
    team_rows: int  # the team's training conversations
    source: str  # "base model" or the general-data file
    row_tokens: tuple[int, ...]  # each row's tokens: its own when its answer is cached, else at the cap
    row_targets: int  # of them scored (the answers)
    distinct_rows: int
    to_answer: int  # prompts the base answers when training starts (0: every answer the rows need is cached)
    from_cache: int  # answers the rows read from the cache
    estimated_s: float | None  # the base's time for `to_answer` at most (None: the model's size is unknown)

    def counted(
        self, summary: DataSummary, lengths: list[int], config: RunConfig
    ) -> tuple[DataSummary, list[int], list[int], int]:
        """The data as the run will read it (the team's records, then the replay rows), each record's tokens, each
        record's tokens as billed (a replay row's 0), and the team's records."""
        limit, reason = summary.max_seq_len, summary.max_seq_len_reason
        if config.max_seq_len == AUTO and self.row_tokens:  # Auto's limit from every record, the rows among them
            choice = choose_max_seq_len(config, np.array([*lengths, *self.row_tokens], dtype=np.int64))
            limit, reason = choice.value, choice.reason
        rows = [min(tokens, limit) if limit else tokens for tokens in self.row_tokens]
        added = sum(rows)
        summary = dataclasses.replace(
            summary,
            examples=summary.examples + self.rows,
            conversations=(summary.conversations or 0) + self.rows,
            messages=(summary.messages or 0) + 2 * self.rows,
            tokens_in_file=(summary.tokens_in_file or 0) + added,
            target_tokens=(summary.target_tokens or 0) + self.row_targets,
            context_tokens=(summary.context_tokens or 0) + added - self.row_targets,
            max_record_tokens=max([summary.max_record_tokens or 0, *rows]),
            max_seq_len=limit,
            max_seq_len_reason=reason,
            counted_with_tokenizer=summary.counted_with_tokenizer,
        )
        return summary, [*lengths, *rows], [*lengths, *([0] * self.rows)], len(lengths)

    def to_dict(self, tokens: int | None, tokens_processed: int | None) -> dict:
        """plan.json's replay_added, as a run's (replay_mix.Mixed.to_dict) with `pending`: what is not known yet."""
        return {
            "ratio": self.ratio, "rows": self.rows, "distinct_rows": self.distinct_rows, "team_rows": self.team_rows,
            "tokens": tokens, "tokens_processed": tokens_processed, "source": self.source, "billed": False,
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
    if config.general_data:
        rows = replay_mix.pick(replay_mix.general_rows(config.general_data), needed, config.seed)
        counts = [_conversation_tokens(tokenizer, row["messages"]) for row in rows]
        distinct = len({str(row) for row in rows})
        return PendingReplay(ratio, needed, len(train), str(config.general_data), *_summed(counts), distinct, 0, 0, 0.0)
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
    counts = [row_tokens(tokenizer, prompt, answer) for prompt, answer in chosen]
    distinct = len(set(chosen))
    seconds = replay.generation_estimate(config, tokenizer, to_answer)
    from_cache = sum(1 for _, answer in set(chosen) if answer is not None)
    return PendingReplay(ratio, needed, len(train), "base model", *_summed(counts), distinct, len(to_answer),
                         from_cache, seconds)  # fmt: skip


def row_tokens(tokenizer, prompt: str, answer: str | None) -> tuple[int, int]:
    """(tokens, scored tokens) of a chat row of a prompt and its answer, rendered as training renders it; an answer
    not given yet (None) at the cap, closed by its end of turn."""
    from finetune.ship.eval.replay import MAX_NEW_TOKENS  # torch: as above (loaded already by the caller)

    asked = prompt_ids(tokenizer, [{"role": "user", "content": prompt}])
    if answer is None:
        return len(asked) + MAX_NEW_TOKENS + 1, MAX_NEW_TOKENS + 1
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    whole = _rendered(tokenizer, messages)
    return whole, whole - len(asked)


def _conversation_tokens(tokenizer, messages: list[dict]) -> tuple[int, int]:
    """(tokens, scored tokens: those after the first assistant reply's prompt) of a general conversation."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    whole = _rendered(tokenizer, messages)
    return whole, whole - len(prompt_ids(tokenizer, messages[:first])) if first else whole


def _rendered(tokenizer, messages: list[dict]) -> int:
    """Tokens of a whole conversation, rendered with the chat template and encoded as training encodes it."""
    return len(
        tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    )


def _summed(counts: list[tuple[int, int]]) -> tuple[tuple[int, ...], int]:
    return tuple(tokens for tokens, _ in counts), sum(targets for _, targets in counts)


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
