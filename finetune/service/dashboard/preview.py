"""The data preview of one uploaded file: what `finetune validate --show` says, shaped for a page.

    preview = make_preview(path, tokenizer, max_seq_len=1024, record_policy="all", val_fraction="auto", seed=0)
    preview.page(offset=0, limit=10)

Every validation problem with its line, the counts, a histogram of record lengths in tokens, a page of records
split into scored and context spans (through the model's chat template when a tokenizer is given), and the
validation split a job with the same seed would make. A file of preference pairs (what a DPO job trains on) is
read as `finetune validate` reads it: each record is a pair, its prompt and preferred answer as spans, and its
rejected answer beside them.
"""

from __future__ import annotations

import dataclasses
import math

from finetune.data.pairs import split_pairs
from finetune.data.preference import is_preference_file, read_preferences
from finetune.data.read import read_file
from finetune.data.sensitive import SENSITIVE_DATA, redacted, scan_pairs, scanned_file
from finetune.data.show import shown_record
from finetune.data.split import auto_val_fraction, split_conversations
from finetune.data.stats import RecordTokens, estimate_record_tokens
from finetune.data.tokenize import ChatTokenizer
from finetune.data.types import Problem
from finetune.data.validate import TEMPLATE_MISMATCH, validate_parsed
from finetune.settings.config import AUTO
from finetune.settings.data_choices import Truncation
from finetune.settings.errors import RecordError

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
        # sensitive values are shown masked: the records are those of the file with placeholders (<EMAIL>, ...) in
        # their place, each record lists its findings (kind, role, place; never the value) and the warning says all
        scanned, found = scanned_file(parsed, "warn")
        masked = dataclasses.replace(parsed, conversations=redacted(parsed.conversations))
        self.result = validate_parsed(masked, tokenizer, max_seq_len, record_policy)
        self.result.warnings += [p for p in scanned.warnings if p.code == SENSITIVE_DATA]
        self.result.sensitive = found
        self._found = _by_line(found)
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
            "kind": "chat",
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
            "records": [
                self._marked(_record(offset + i + 1, c, decode, self._val_lines)) for i, c in enumerate(counts)
            ],
            "sensitive_data": {k: v for k, v in result.sensitive.items() if k != "findings"},
        }

    def _marked(self, record: dict) -> dict:
        """A record with its line's sensitive values (kind, role, message, place in it; the text shows placeholders)."""
        return record | {"sensitive": self._found.get(record["line"], [])}


def _by_line(found: dict) -> dict[int, list[dict]]:
    """The sensitive values found (sensitive.py's summary), by file line, each without its line."""
    lines: dict[int, list[dict]] = {}
    for finding in found["findings"]:
        lines.setdefault(finding["line"], []).append({k: v for k, v in finding.items() if k != "line"})
    return lines


def make_preview(path: str, tokenizer=None, max_seq_len: int = 1024, record_policy: str = "all",
                 val_fraction: float | str = AUTO, seed: int = 0) -> FilePreview | PreferencePreview:  # fmt: skip
    """The preview of a chat file, or of a file of preference pairs (known by its first line, as the CLI does)."""
    if is_preference_file(path):
        return PreferencePreview(path, tokenizer, max_seq_len, val_fraction, seed)
    return FilePreview(path, tokenizer, max_seq_len, record_policy, val_fraction, seed)


class PreferencePreview:
    """Validation, counts and split of a preference file (`finetune validate PREFS.jsonl`), computed once."""

    def __init__(
        self, path: str, tokenizer=None, max_seq_len: int = 1024, val_fraction: float | str = AUTO, seed: int = 0
    ) -> None:
        parsed, found = scanned_file(read_preferences(path), "warn")  # values shown masked, as in FilePreview
        parsed = dataclasses.replace(parsed, pairs=scan_pairs(parsed.pairs, redact=True)[0])
        self._found, self._sensitive = _by_line(found), {k: v for k, v in found.items() if k != "findings"}
        self.errors, self.warnings, self.format = list(parsed.errors), list(parsed.warnings), parsed.format
        self.tokenizer, self.max_seq_len = tokenizer, max_seq_len
        chat = None
        if tokenizer is not None:
            chat = ChatTokenizer(tokenizer)
        # per pair: (chosen counts, rejected counts); a pair the template refuses is an error, as in training
        self.pairs: list[tuple[RecordTokens, RecordTokens]] = []
        for index, pair in enumerate(parsed.pairs):
            try:
                sides = [self._count(pair.record(answer, index), chat) for answer in (pair.chosen, pair.rejected)]
            except RecordError as exc:
                self.errors.append(Problem(exc.line, TEMPLATE_MISMATCH, exc.reason))
                continue
            self.pairs.append((sides[0], sides[1]))
        prompts = len({p.prompt_conversation().key() for p in parsed.pairs})
        fraction, reason = self._fraction(val_fraction, prompts)
        train, val = split_pairs(parsed.pairs, fraction, seed) if parsed.pairs else ([], [])
        self._val_lines = {p.line for p in val}
        self.split = {
            "val_fraction": fraction, "reason": reason, "seed": seed, "train_conversations": len(train),
            "val_conversations": len(val), "val_lines": sorted(self._val_lines)[:MAX_VAL_LINES],
        }  # fmt: skip
        lengths = [counts.total for both in self.pairs for counts in both]
        self.stats = {
            "format": parsed.format,
            "pairs": len(parsed.pairs),
            "prompts": prompts,
            "chosen_tokens": sum(chosen.target for chosen, _ in self.pairs),
            "rejected_tokens": sum(rejected.target for _, rejected in self.pairs),
            "record_tokens": {"max": max(lengths, default=0)},
        }
        self._lengths = lengths

    def _count(self, record, chat) -> RecordTokens:
        if chat is None:
            return estimate_record_tokens(record, self.max_seq_len)
        # the pair's answer as training reads it: context cut from the left, targets counted on the whole record
        outcome = chat.tokenize(record, self.max_seq_len, Truncation.LEFT)
        whole = outcome.record or chat.tokenize(record, outcome.total_tokens, Truncation.LEFT).record
        target = whole.num_targets if whole is not None else 0
        return RecordTokens(record, outcome.total_tokens, target, outcome.cut_tokens, outcome.record, outcome.dropped)

    @staticmethod
    def _fraction(val_fraction: float | str, prompts: int) -> tuple[float, str]:
        if val_fraction == AUTO:
            return auto_val_fraction(prompts)
        fraction = float(val_fraction)
        return fraction, "validation off" if fraction == 0 else f"your validation share {fraction:g}"

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def page(self, offset: int = 0, limit: int = 10) -> dict:
        decode = self._decode if self.tokenizer is not None else None
        records = []
        for number, (chosen, rejected) in enumerate(self.pairs[offset : offset + limit], start=offset + 1):
            shown = _record(number, chosen, decode, self._val_lines)
            answer = shown_record(number, rejected, decode)
            shown["rejected_spans"] = [{"text": s.text, "weight": s.weight} for s in answer.spans if s.weight > 0]
            shown["rejected_tokens"] = answer.target_tokens
            records.append(shown | {"sensitive": self._found.get(shown["line"], [])})
        return {
            "object": "dashboard.file_preview",
            "kind": "preference",
            "ok": not self.errors,
            "format": self.format,
            "errors": [p.to_dict() for p in self.errors],
            "warnings": [p.to_dict() for p in self.warnings],
            "stats": self.stats,
            "tokens_exact": self.tokenizer is not None,
            "histogram": histogram(self._lengths, self.max_seq_len),
            "split": self.split,
            "records_total": len(self.pairs),
            "offset": offset,
            "limit": limit,
            "records": records,
            "sensitive_data": self._sensitive,
        }
