"""The forgetting curve's set: held-out general prompts answered by the base model, as validation records.

    records, about = general_val_set(plan, tokenizer, ctx)    # `about` is plan.json's general_val_set

The shipped replay prompts hold a slice that is never trained on (data/replay_mix.held_out_prompts, about one in
eight). The base model answers those greedily, once per base and chat template, cached like replay's own answers
(replay.base_answers(..., held_out=True)); the answers are then tokenized exactly as the run's validation records
are: the run's chat template, record policy, truncation and record length limit. The loop evaluates them at every
evaluation (general_val_loss, normalised like val_loss: a mean over their target tokens) and once before the first
step of a fresh run (general_val_loss_base: the starting model, which is the base), so the curve shows how far the
tuned model drifts from what the base itself would answer. These prompts are for watching and choosing; the
retention check's general set (eval/general/) stays the independent judge and is never read here.
"""

from __future__ import annotations

import dataclasses
import json
import time

from finetune.data.prepare import prepare_conversations
from finetune.data.read import parse_bytes
from finetune.data.replay_mix import held_out_prompts
from finetune.data.skipped import usable_conversations
from finetune.data.tokenize import ChatTokenizer
from finetune.plan.plan import Plan
from finetune.rules.arithmetic import evaluates_after
from finetune.settings.config import RunConfig
from finetune.ship.eval import replay
from finetune.ship.eval.replay_preview import Records, answer_row
from finetune.train.distributed import DistContext, barrier

SOURCE = "the forgetting curve's general answers"


def general_val_set(plan: Plan, tokenizer, ctx: DistContext | None = None) -> tuple[object, dict]:
    """The records (TokenizedRecord-like, as the loop's validation set) and what they cost, for plan.json. Rank 0
    generates the answers when they are not cached yet; the other ranks then read the cache."""
    config = plan.run
    cached = replay.all_cached(config, tokenizer, [p.text for p in held_out_prompts()])
    started = time.perf_counter()
    rows, failure = None, None
    if ctx is None or ctx.is_main:
        try:
            rows = replay.base_answers(config, tokenizer, held_out=True)
        except Exception as exc:  # the other ranks must not wait for it forever
            failure = exc
    if ctx is not None:
        barrier(ctx)
    if failure is not None:
        raise failure
    rows = rows or replay.base_answers(config, tokenizer, held_out=True)  # another rank: what rank 0 cached
    generation_s = 0.0 if cached else round(time.perf_counter() - started, 1)
    prepared = tokenized(rows, config, tokenizer, plan.max_seq_len)
    return prepared.train, describe(plan, prepared, len(rows), cached, generation_s)


def tokenized(rows: list[dict], config: RunConfig, tokenizer, max_seq_len: int):
    """Chat rows -> records (`.train`; `.summary` counts the answers shortened or left out at the record limit),
    tokenized as the run's data is: nothing held out of them, nothing refused."""
    data = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
    conversations, _ = usable_conversations(parse_bytes(data, SOURCE, "chat"), skip_invalid=False)
    settings = dataclasses.replace(
        config, data=SOURCE, format="chat", val_file=None, val_fraction=0.0, test_fraction=0.0, strict=False,
        skip_invalid=False, sensitive_data="warn", max_seq_len=max_seq_len,
    )  # fmt: skip
    return prepare_conversations(conversations, None, settings, tokenizer)


def evaluations(plan: Plan) -> int:
    """How often the loop evaluates the set: at each of the run's evaluations, and once before its first step."""
    return 1 + sum(
        1
        for step in range(1, plan.total_steps + 1)
        if evaluates_after(step, plan.eval_every, plan.steps_per_epoch, plan.total_steps)
    )


def describe(plan: Plan, prepared, answers: int, cached: bool, generation_s: float) -> dict:
    """plan.json's general_val_set: the set, how many tokens the evaluations read, their time (an estimate)."""
    records, summary = prepared.train, prepared.summary
    tokens, count = int(records.total_tokens), evaluations(plan)
    return {
        "prompts": len(held_out_prompts()),
        "answers": answers,  # the base's answers that ended (kept), of the prompts
        "records": len(records),
        "shortened": summary.truncated_records,  # answers cut to the run's record length limit
        "left_out": summary.dropped_records,  # answers that could not fit it
        "tokens": tokens,
        "target_tokens": int(records.total_targets),
        "evaluations": count,
        "tokens_read": tokens * count,
        "seconds": _seconds(plan, tokens * count),
        "source": "base model",
        "cached": cached,  # the answers were read from the cache (False: generated for this run)
        "generation_s": generation_s,
        "billed": False,
    }


def _seconds(plan: Plan, tokens_read: int) -> float | None:
    """Evaluation reads a token for about a third of a training token's work (forward only): the plan's speed, or
    its time estimate per billed token, applied to the tokens the curve reads."""
    cost = plan.cost
    if cost.tokens_per_s:
        return round(tokens_read / 3 / (cost.tokens_per_s * cost.devices), 1)
    trained = plan.tokens_trained or cost.billed_tokens  # the time estimate covers every token trained on
    if cost.seconds and trained:
        return round(cost.seconds * tokens_read / 3 / trained, 1)
    return None


def counted_set(plan: Plan, tokenizer) -> dict:
    """plan.json's general_val_set for a plan that generates nothing (no output folder): the set itself when the cache
    holds every answer (no model loaded), else counted: each answer not given yet at the cap (`pending` says how
    many the base answers when training starts, and about how long that takes)."""
    config, prompts = plan.run, [p.text for p in held_out_prompts()]
    if replay.all_cached(config, tokenizer, prompts):
        return general_val_set(plan, tokenizer)[1]
    cached = replay.cached_answers(config, tokenizer)
    missing = [p for p in prompts if p not in cached]
    records = Records(ChatTokenizer(tokenizer), config.record_policy, replay.MAX_NEW_TOKENS)
    lengths, targets = records.of([answer_row(p, cached.get(p)) for p in prompts if cached.get(p, "") is not None])
    tokens, count = sum(min(n, plan.max_seq_len) for n in lengths), evaluations(plan)
    return {
        "prompts": len(prompts), "answers": None, "records": len(lengths), "shortened": None, "left_out": None,
        "tokens": tokens, "target_tokens": targets, "evaluations": count,
        "tokens_read": tokens * count, "seconds": _seconds(plan, tokens * count), "source": "base model",
        "cached": False, "generation_s": None, "billed": False,
        "pending": {"prompts": len(missing), "estimated_s": replay.generation_estimate(config, tokenizer, missing)},
    }  # fmt: skip
