"""Without a tokenizer (no model: `finetune plan DATA.jsonl`): the data's numbers estimated from its text."""

from __future__ import annotations

import numpy as np

from finetune.data.combine import TRAIN, VAL, PreparedData, display_name, limit_fields, percentile, val_fraction
from finetune.data.fitting import Fit, LongRecords, fit
from finetune.data.read import DUPLICATE_LINES_SHOWN, find_duplicates
from finetune.data.records import build_records
from finetune.data.seq_len import choose_max_seq_len
from finetune.data.split import remove_overlap, split_conversations
from finetune.data.stats import estimate_record_tokens
from finetune.data.types import Conversation, DataSummary, Record
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError


def estimate(
    train_conversations: list[Conversation], val_conversations: list[Conversation] | None, config: RunConfig
) -> PreparedData:
    """Token counts from text length alone, for planning without a tokenizer; records fitted to the limit with
    the same policy (fitting.py), on the estimates."""
    unique = len({c.key() for c in train_conversations})
    copies = [line for line, _ in find_duplicates(train_conversations)]
    fraction, reason = val_fraction(config, unique)
    if val_conversations is None:
        split = split_conversations(train_conversations, fraction, config.seed)
    else:
        split = remove_overlap(train_conversations, val_conversations)
    built = {
        side: records_of(conversations, config.record_policy)
        for side, conversations in ((TRAIN, split.train), (VAL, split.val))
    }
    if not built[TRAIN]:
        raise UserError("no training records: no assistant message has a weight above 0")
    measure = {side: [estimate_record_tokens(r, 0).total for r in records] for side, records in built.items()}
    limit = choose_max_seq_len(config, np.array(measure[TRAIN] + measure[VAL], dtype=np.int64))
    names = {TRAIN: display_name(config.data), VAL: display_name(config.val_file or config.data)}
    long = LongRecords(limit.value, str(config.truncation), longest=max(measure[TRAIN] + measure[VAL]))
    kept: dict[int, list] = {TRAIN: [], VAL: []}
    for side, records in built.items():
        for record, total in zip(records, measure[side], strict=True):
            kept[side] += _fit_estimated(record, total, limit.value, config, long, names[side])
    if config.strict and (error := long.strict_error(limit.reason or None)):
        raise UserError(error)
    if not kept[TRAIN]:
        raise UserError(f"{config.data or 'training data'}: nothing trainable remains: {long.sentence()}")
    train_records = [estimate for estimate, _ in kept[TRAIN]]
    lengths = [min(e.total, limit.value) for e in train_records]
    targets = sum(e.target for e in train_records)
    ordered = np.sort(np.array(lengths, dtype=np.int64))
    summary = DataSummary(
        examples=len(train_records),
        validation_examples=len(kept[VAL]),
        conversations=len(split.train),
        validation_conversations=len(split.val),
        messages=sum(len(c.messages) for c in split.train),
        tokens_in_file=int(ordered.sum()),
        counted_with_tokenizer=False,
        target_tokens=targets,
        context_tokens=int(ordered.sum()) - targets,
        max_record_tokens=int(ordered[-1]) or None,
        p50_record_tokens=percentile(ordered, 0.5),
        p95_record_tokens=percentile(ordered, 0.95),
        truncated_records=sum(kind is Fit.SHORTENED for _, kind in kept[TRAIN]),
        truncated_tokens=sum(e.cut for e in train_records),
        dropped_records=len(long.dropped_at),
        duplicates_removed=split.duplicates_removed,
        duplicate_conversations=len(copies),
        duplicate_lines=tuple(copies[:DUPLICATE_LINES_SHOWN]),
        val_fraction=fraction,
        val_fraction_reason=reason,
        **limit_fields(limit, long),
    )
    return PreparedData([], [], summary, None)


def _fit_estimated(record: Record, total: int, max_seq_len: int, config: RunConfig, long: LongRecords, name: str):
    """fitting.fit on token estimates: [(RecordTokens, Fit)] kept, and what happened noted in `long`."""
    parts = fit(record, total, max_seq_len, config.truncation, lambda part: estimate_record_tokens(part, 0).total)
    if parts is None:
        long.note(f"{name}:{record.line}", 1, 0, [total])
        return []
    counted = [(estimate_record_tokens(part, max_seq_len), kind) for part, kind in parts]
    kept = [(estimate, kind) for estimate, kind in counted if not estimate.dropped]
    if total > max_seq_len:
        long.note(f"{name}:{record.line}", len(parts), len(kept), [e.total for e, _ in counted if e.dropped])
    return kept


def records_of(conversations: list[Conversation], policy: str) -> list[Record]:
    return [r for i, c in enumerate(conversations) for r in build_records(c, i, policy)]
