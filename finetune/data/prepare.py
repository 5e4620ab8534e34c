"""From a RunConfig to tokenized, split records: the whole data path in one call.

    prepared = prepare_data(config)          # reads config.data (and config.val_file), validates,
    prepared.train, prepared.val             # splits by conversation, builds records, tokenizes
    prepared.summary                         # DataSummary: the numbers the plan needs (no torch)

Without a tokenizer (no --model, e.g. `finetune plan DATA.jsonl`), token numbers are estimated
from the text and `summary.counted_with_tokenizer` is False.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from finetune.config import AUTO, RunConfig
from finetune.data.records import build_records
from finetune.data.split import auto_val_fraction, remove_overlap, split_conversations
from finetune.data.stats import estimate_record_tokens
from finetune.data.tokenize import ChatTokenizer, check_masking, load_tokenizer
from finetune.data.types import Conversation, DataSummary, Record, TokenizedRecord
from finetune.errors import UserError


@dataclass
class PreparedData:
    train: list[TokenizedRecord]
    val: list[TokenizedRecord]
    summary: DataSummary  # the numbers the plan needs; its advice reads truncation and drops from here
    end_of_turn_id: int | None = None
    skipped: list[dict] = field(default_factory=list)  # --skip-invalid: the lines left out, for OUT/skipped.jsonl


@dataclass
class _Side:
    """Tokenized records of one side of the split, with what happened on the way."""

    records: list[TokenizedRecord] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    target_tokens: int = 0
    truncated_records: int = 0
    truncated_tokens: int = 0
    dropped: list[tuple[int, str, int]] = field(default_factory=list)  # (line, reason, tokens over)


def read_conversations(
    path: str, format: str | None = None, skip_invalid: bool = False
) -> tuple[list[Conversation], list[dict]]:
    """Read and validate a file; any error stops here with every problem listed, unless skip_invalid
    (then the invalid lines are returned, for OUT/skipped.jsonl)."""
    from finetune.data.read import read_file
    from finetune.data.skipped import usable_conversations

    return usable_conversations(read_file(path, format), skip_invalid)


def _records(conversations: list[Conversation], policy: str) -> list[Record]:
    return [r for i, c in enumerate(conversations) for r in build_records(c, i, policy)]


def _tokenize_side(records: list[Record], chat: ChatTokenizer, config: RunConfig) -> _Side:
    side = _Side()
    for record in records:
        outcome = chat.tokenize(record, config.max_seq_len, config.truncation)
        if outcome.record is None:
            side.dropped.append((record.line, outcome.dropped or "", outcome.cut_tokens))
            continue
        side.records.append(outcome.record)
        side.lengths.append(len(outcome.record))
        side.target_tokens += outcome.record.num_targets
        if outcome.cut_tokens:
            side.truncated_records += 1
            side.truncated_tokens += outcome.cut_tokens
    return side


def _estimate_side(records: list[Record]) -> _Side:
    """Token counts from text length alone, for planning without a tokenizer."""
    side = _Side()
    for record in records:
        estimate = estimate_record_tokens(record, max_seq_len=0)
        side.lengths.append(estimate.total)
        side.target_tokens += estimate.target
    return side


def _percentile(values: list[int], q: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if q > 0 else ordered[0]


def _val_fraction(config: RunConfig, unique_conversations: int) -> tuple[float, str]:
    if config.val_file:
        return 0.0, f"your validation file {config.val_file}"
    if config.val_fraction == AUTO:
        return auto_val_fraction(unique_conversations)
    if config.val_fraction == 0:
        return 0.0, "validation off (--val-fraction 0)"
    return float(config.val_fraction), f"your --val-fraction {config.val_fraction}"


def prepare_conversations(
    train_conversations: list[Conversation],
    val_conversations: list[Conversation] | None,
    config: RunConfig,
    tokenizer=None,
) -> PreparedData:
    """Split (unless a validation set is given), build records, tokenize, check the masks."""
    unique = len({c.key() for c in train_conversations})
    fraction, reason = _val_fraction(config, unique)
    if val_conversations is None:
        split = split_conversations(train_conversations, fraction, config.seed)
    else:
        split = remove_overlap(train_conversations, val_conversations)

    train_records = _records(split.train, config.record_policy)
    val_records = _records(split.val, config.record_policy)
    if not train_records:
        raise UserError("no training records: no assistant message has a weight above 0")

    chat = ChatTokenizer(tokenizer) if tokenizer is not None else None
    if chat is not None:
        train = _tokenize_side(train_records, chat, config)
        val = _tokenize_side(val_records, chat, config)
        source = config.data or "training data"
        if not train.records:
            raise UserError(f"{source}: every record is longer than --max-seq-len {config.max_seq_len}")
        check_masking(train.records, chat.end_of_turn_id, source)
        check_masking(val.records, chat.end_of_turn_id, config.val_file or source)
    else:
        train, val = _estimate_side(train_records), _estimate_side(val_records)

    tokens_in_file = sum(train.lengths)
    dropped = train.dropped + val.dropped
    summary = DataSummary(
        examples=len(train.lengths),
        validation_examples=len(val.lengths),
        conversations=len(split.train),
        validation_conversations=len(split.val),
        messages=sum(len(c.messages) for c in split.train),
        tokens_in_file=tokens_in_file,
        counted_with_tokenizer=chat is not None,
        target_tokens=train.target_tokens,
        context_tokens=tokens_in_file - train.target_tokens,
        max_record_tokens=max(train.lengths, default=0) or None,
        p50_record_tokens=_percentile(train.lengths, 0.5),
        p95_record_tokens=_percentile(train.lengths, 0.95),
        truncated_records=train.truncated_records,
        truncated_tokens=train.truncated_tokens,
        dropped_records=len(dropped),
        dropped_lines=tuple(line for line, _, _ in dropped),
        duplicates_removed=split.duplicates_removed,
        val_fraction=fraction,
        val_fraction_reason=reason,
    )
    return PreparedData(train.records, val.records, summary, chat.end_of_turn_id if chat else None)


def prepare_data(config: RunConfig, tokenizer=None) -> PreparedData:
    """Read, validate, split, build records and tokenize. Raises UserError for unusable input."""
    if not config.data:
        raise UserError("no training file given")
    train, skipped = read_conversations(config.data, config.format, config.skip_invalid)
    val = None
    if config.val_file:
        val, val_skipped = read_conversations(config.val_file, config.format, config.skip_invalid)
        skipped += val_skipped
    if tokenizer is None and config.model:
        tokenizer = load_tokenizer(config.model, config.trust_remote_code)
    prepared = prepare_conversations(train, val, config, tokenizer)
    if skipped:
        prepared.skipped = skipped
        prepared.summary = replace(prepared.summary, skipped_lines=len(skipped))
    return prepared
