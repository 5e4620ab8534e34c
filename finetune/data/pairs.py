"""A preference file's pairs split by prompt and tokenized: the data of a preference-tuning (DPO) run.

prepared = prepare_pairs(config, tokenizer)     # PreparedPairs: train, val, summary (preference.py reads them)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from finetune.data import sensitive
from finetune.data.fitting import LongRecords, dropped_lines, in_file_order
from finetune.data.preference import PreferencePair, TokenizedPair, load_pairs
from finetune.data.redaction import skipped_as_kept
from finetune.data.seq_len import choose_max_seq_len
from finetune.data.split import auto_val_fraction, split_conversations
from finetune.data.stats import estimate_record_tokens
from finetune.data.tokenize import ChatTokenizer, as_lists, check_masking, cut_to_length
from finetune.data.types import DataSummary
from finetune.rules.auto import Choice
from finetune.rules.model_facts import ModelFacts
from finetune.settings.config import AUTO
from finetune.settings.errors import UserError
from finetune.settings.wording import ref


def split_pairs(
    pairs: list[PreferencePair], fraction: float, seed: int
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Hold out whole prompts: the split of supervised data, on the pairs' prompts (duplicates group together)."""
    split = split_conversations([p.prompt_conversation() for p in pairs], fraction, seed)
    held_out = {c.line for c in split.val}
    return [p for p in pairs if p.line not in held_out], [p for p in pairs if p.line in held_out]


@dataclass
class PreparedPairs:
    train: list[TokenizedPair]
    val: list[TokenizedPair]
    summary: DataSummary
    end_of_turn_id: int | None = None
    skipped: list[dict] = field(default_factory=list)  # --skip-invalid: the lines left out, for OUT/skipped.jsonl
    cache_entry: str | None = None  # pairs are not kept in the token cache (small files, tokenized in seconds)
    from_cache: bool = False


def _prompts(pairs: list[PreferencePair]) -> int:
    return len({p.prompt_conversation().key() for p in pairs})


def _whole_pairs(pairs: list[PreferencePair], chat) -> list[tuple[PreferencePair, list]]:
    """Each pair's two sides (chosen, rejected), tokenized whole: (record, EncodedOutcome) each."""
    wholes = []
    for i, pair in enumerate(pairs):
        records = [pair.record(answer, i) for answer in (pair.chosen, pair.rejected)]
        wholes.append((pair, [(record, chat.tokenize_whole(record)) for record in records]))
    return wholes


def _fit_pairs(wholes, limit: int, truncation, long: LongRecords, name: str) -> list[TokenizedPair]:
    """The pairs whose sides fit the limit (a side's prompt cut from the left, never its answer); the others
    are dropped. What happened is noted in `long` (a pair is one answer: it is never split)."""
    kept = []
    for pair, sides in wholes:
        fitted = [as_lists(record, cut_to_length(whole, limit, truncation)) for record, whole in sides]
        place = f"{name}:{pair.line}"
        if any(side.record is None for side in fitted):
            long.dropped_at.append(place)
            long.dropped_need = max(long.dropped_need, *(side.total_tokens for side in fitted))
            continue
        if any(side.cut_tokens for side in fitted):
            long.shortened_at.append(place)
        kept.append(TokenizedPair(fitted[0].record, fitted[1].record, pair.line))
    return kept


@dataclass
class _Split:
    """The pairs read (their sensitive values scanned) and split by prompt: where tokenizing, or estimating, starts."""

    train: list[PreferencePair]
    val: list[PreferencePair]
    skipped: list[dict]  # --skip-invalid: the lines left out
    fraction: float  # the share of prompts held out for validation
    reason: str  # why that share
    shared: int  # validation pairs whose prompt is also trained on: left out, or validation would see training
    found: dict | None  # the sensitive values found in both files (sensitive.named)


def _read_and_split(config) -> _Split:
    """Both files read and scanned (refused here with sensitive_data refuse); the validation pairs, held out by
    prompt or read from the validation file without the prompts trained on."""
    train, skipped = load_pairs(config.data, config.skip_invalid)
    skipped = skipped_as_kept(skipped, config.sensitive_data)
    train, found = sensitive.scan_pairs(train, config.sensitive_data == "redact")  # placeholders with redact
    found_by_source = {"data": found}
    shared = 0
    if config.val_file:
        val, val_skipped = load_pairs(config.val_file, config.skip_invalid)
        val, found_by_source["val_file"] = sensitive.scan_pairs(val, config.sensitive_data == "redact")
        skipped += skipped_as_kept(val_skipped, config.sensitive_data)
        fraction, reason = 0.0, f"your validation file {config.val_file}"
        seen = {p.prompt_conversation().key() for p in train}
        kept = [p for p in val if p.prompt_conversation().key() not in seen]
        val, shared = kept, len(val) - len(kept)
    else:
        fraction, reason = _val_fraction(config, _prompts(train))
        train, val = split_pairs(train, fraction, config.seed)
    names = {"data": Path(config.data).name, "val_file": Path(config.val_file or config.data).name}
    found = sensitive.named(sensitive.of_sides(found_by_source, config.sensitive_data), names)
    sensitive.refuse_if_found(found)
    return _Split(train, val, skipped, fraction, reason, shared, found)


def _val_fraction(config, prompts: int) -> tuple[float, str]:
    """The share of the prompts held out for validation, and why."""
    if config.val_fraction == AUTO:
        fraction, reason = auto_val_fraction(prompts)
        return fraction, reason.replace("conversations", "prompts")
    fraction = float(config.val_fraction)
    if fraction == 0:
        return fraction, f"validation off ({ref('val_fraction', 0)})"
    return fraction, f"your {ref('val_fraction')} {fraction}"


def _estimated(split: _Split, config, facts: ModelFacts | None) -> PreparedPairs:
    """The numbers of the pairs counted from their text, without a tokenizer."""
    sides = [
        [estimate_record_tokens(p.record(a, i), max_seq_len=0) for a in (p.chosen, p.rejected)]
        for i, p in enumerate(split.train)
    ]
    lengths = [sum(e.total for e in pair) for pair in sides]
    limit = choose_max_seq_len(config, np.array([e.total for pair in sides for e in pair]), 2, facts)
    summary = DataSummary(
        examples=len(split.train),
        validation_examples=len(split.val),
        conversations=_prompts(split.train),
        validation_conversations=_prompts(split.val),
        messages=sum(len(p.prompt) + 2 for p in split.train),
        tokens_in_file=sum(lengths),
        counted_with_tokenizer=False,
        target_tokens=sum(e.target for pair in sides for e in pair),
        max_record_tokens=max((e.total for pair in sides for e in pair), default=0) or None,
        val_fraction=split.fraction,
        val_fraction_reason=split.reason,
        max_seq_len=limit.value,
        max_seq_len_reason=limit.reason or None,
        skipped_lines=len(split.skipped),
        duplicates_removed=split.shared,
        sensitive_found=split.found,
    )
    return PreparedPairs([], [], summary, skipped=split.skipped)


def prepare_pairs(config, tokenizer=None, facts: ModelFacts | None = None) -> PreparedPairs:
    """Read, validate, split by prompt and tokenize a preference file (and --val-file): the data of a dpo run.
    `facts`: the model's, when the caller read them (read here otherwise)."""
    split = _read_and_split(config)
    if tokenizer is None:  # `finetune plan PREFS.jsonl` without --model: token numbers from the text
        return _estimated(split, config, facts)
    chat = ChatTokenizer(tokenizer)
    train_whole, val_whole = _whole_pairs(split.train, chat), _whole_pairs(split.val, chat)
    lengths = [whole.total_tokens for _, sides in train_whole + val_whole for _, whole in sides]
    limit = choose_max_seq_len(config, np.array(lengths, dtype=np.int64), 2, facts)
    long = LongRecords(limit.value, str(config.truncation), longest=max(lengths, default=0))
    names = (Path(config.data).name, Path(config.val_file or config.data).name)
    train_pairs = _fit_pairs(train_whole, limit.value, config.truncation, long, names[0])
    dropped = [int(place.rpartition(":")[2]) for place in long.dropped_at]
    val_pairs = _fit_pairs(val_whole, limit.value, config.truncation, long, names[1])
    val_dropped = [int(place.rpartition(":")[2]) for place in long.dropped_at[len(dropped) :]]
    if config.strict and (error := long.strict_error(limit.reason or None)):
        raise UserError(error)
    if not train_pairs:
        raise UserError(f"{config.data}: nothing trainable remains: {long.sentence()}")
    records = [r for p in train_pairs for r in (p.chosen, p.rejected)]
    check_masking(records, chat.end_of_turn_id, config.data)
    dropped_at = dropped_lines([(0, n) for n in dropped] + [(1, n) for n in val_dropped], config.val_file)
    summary = _tokenized_summary(split, train_pairs, len(val_pairs), limit, long, dropped_at)
    return PreparedPairs(train_pairs, val_pairs, summary, chat.end_of_turn_id, split.skipped)


def _tokenized_summary(
    split: _Split, train: list[TokenizedPair], val_pairs: int, limit: Choice[int], long: LongRecords, dropped_at
) -> DataSummary:
    """The numbers of the tokenized pairs the plan is built from (a pair's two sides are two records)."""
    records = [r for p in train for r in (p.chosen, p.rejected)]
    lengths = sorted(len(p) for p in train)
    tokens, targets = sum(lengths), sum(r.num_targets for r in records)
    return DataSummary(
        examples=len(train),
        validation_examples=val_pairs,
        conversations=_prompts(split.train),
        validation_conversations=_prompts(split.val),
        messages=sum(len(p.prompt) + 2 for p in split.train),
        tokens_in_file=tokens,
        target_tokens=targets,
        context_tokens=tokens - targets,
        max_record_tokens=max(len(r) for r in records),
        p50_record_tokens=lengths[len(lengths) // 2],
        p95_record_tokens=lengths[min(len(lengths) - 1, int(0.95 * len(lengths)))],
        dropped_records=len(long.dropped_at),
        dropped_lines=dropped_at,
        duplicates_removed=split.shared,
        skipped_lines=len(split.skipped),
        val_fraction=split.fraction,
        val_fraction_reason=split.reason,
        max_seq_len=limit.value,
        max_seq_len_reason=limit.reason or None,
        shortened_at=tuple(in_file_order(long.shortened_at)),
        dropped_at=tuple(in_file_order(long.dropped_at)),
        dropped_need_tokens=long.dropped_need,
        sensitive_found=split.found,
    )
