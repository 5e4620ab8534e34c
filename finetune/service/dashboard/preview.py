"""The data preview of one uploaded file: what `finetune validate --show` says, shaped for a page.

    preview = FilePreview(path, tokenizer, max_seq_len=1024, record_policy="all", val_fraction="auto", seed=0)
    preview.page(offset=0, limit=10)

Every validation problem with its line, the counts, a histogram of record lengths in tokens, a page of records
split into scored and context spans (through the model's chat template when a tokenizer is given), and the
validation split a job with the same seed would make.
"""

from __future__ import annotations

import math

from finetune.config import AUTO
from finetune.data.read import read_file
from finetune.data.show import shown_record
from finetune.data.split import auto_val_fraction, split_conversations
from finetune.data.stats import RecordTokens
from finetune.data.validate import validate_parsed

HISTOGRAM_BINS = 20
MAX_VAL_LINES = 2000


def histogram(lengths: list[int], max_seq_len: int, bins: int = HISTOGRAM_BINS) -> dict:
    """Equal-width bins from 0 over the longest record, with a round width (so the edges read well)."""
    top = max(lengths, default=0)
    raw = max(1.0, top / bins)
    magnitude = 10 ** math.floor(math.log10(raw))
    width = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    width = max(1, int(math.ceil(width)))
    count = max(1, math.ceil((top + 1) / width))
    counts = [0] * count
    for n in lengths:
        counts[min(count - 1, n // width)] += 1
    return {"edges": [i * width for i in range(count + 1)], "counts": counts, "max_seq_len": max_seq_len}


def _split(conversations, val_fraction: float | str, seed: int) -> dict:
    unique = len({c.key() for c in conversations})
    if val_fraction == AUTO:
        fraction, reason = auto_val_fraction(unique)
    else:
        fraction = float(val_fraction)
        reason = "validation off" if fraction == 0 else f"your validation share {fraction:g}"
    split = split_conversations(conversations, fraction, seed)
    val_lines = sorted(c.line for c in split.val)
    return {
        "val_fraction": fraction,
        "reason": reason,
        "seed": seed,
        "train_conversations": len(split.train),
        "val_conversations": len(split.val),
        "val_lines": val_lines[:MAX_VAL_LINES],
    }


def _record(number: int, counts: RecordTokens, decode, val_lines: set[int]) -> dict:
    shown = shown_record(number, counts, decode)
    return {
        "line": shown.line,
        "record": shown.number,
        "split": "validation" if shown.line in val_lines else "train",
        "tokens": shown.total_tokens,
        "target_tokens": shown.target_tokens,
        "truncated_tokens": shown.truncated_tokens,
        "tokens_exact": shown.exact,
        "spans": [{"text": s.text, "weight": s.weight} for s in shown.spans],
    }


class FilePreview:
    """Validation, counts and split of one file, computed once; `page()` renders a page of its records."""

    def __init__(
        self,
        path: str,
        tokenizer=None,
        max_seq_len: int = 1024,
        record_policy: str = "all",
        val_fraction: float | str = AUTO,
        seed: int = 0,
    ) -> None:
        parsed = read_file(path)
        self.result = validate_parsed(parsed, tokenizer, max_seq_len, record_policy)
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.split = _split(parsed.conversations, val_fraction, seed)
        self._val_lines = set(self.split["val_lines"])

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def page(self, offset: int = 0, limit: int = 10) -> dict:
        result = self.result
        decode = self._decode if self.tokenizer is not None else None
        counts = result.counts[offset : offset + limit]
        return {
            "object": "dashboard.file_preview",
            "ok": result.ok,
            "format": result.format,
            "errors": [p.to_dict() for p in result.errors],
            "warnings": [p.to_dict() for p in result.warnings],
            "stats": result.stats,
            "tokens_exact": self.tokenizer is not None,
            "histogram": histogram([c.total for c in result.counts], self.max_seq_len),
            "split": self.split,
            "records_total": len(result.counts),
            "offset": offset,
            "limit": limit,
            "records": [_record(offset + i + 1, c, decode, self._val_lines) for i, c in enumerate(counts)],
        }


def preview_file(path: str, tokenizer=None, offset: int = 0, limit: int = 10, **settings) -> dict:
    return FilePreview(path, tokenizer, **settings).page(offset, limit)
