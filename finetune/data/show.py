"""Show records with the scored tokens marked, so a person can see what the model will learn.

    finetune validate FILE --model DIR --show 3

Scored (target) text is always wrapped in [[ ]] (with `×w` after it when its weight is below 1),
so the marks survive pipes, logs and --json; on a terminal it is also coloured. Everything outside
the brackets is context: read by the model, never scored. The end-of-turn token appears as its
text (e.g. `<|im_end|>`) and must sit inside the brackets, or the model never learns to stop.
Without a tokenizer the records are shown message by message instead of token by token.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from finetune.data.stats import RecordTokens, message_text
from finetune.data.types import Record, TokenizedRecord

OPEN, CLOSE = "[[", "]]"
TARGET_STYLE = "bold green"
CONTEXT_STYLE = "dim"


@dataclass(frozen=True)
class Span:
    """A run of text with one loss weight: 0 = context, > 0 = scored."""

    text: str
    weight: float

    @property
    def scored(self) -> bool:
        return self.weight > 0


@dataclass(frozen=True)
class ShownRecord:
    """One record ready to print: where it comes from, its counts, and its marked spans."""

    line: int
    number: int  # 1-based position among the file's records
    target_tokens: int
    total_tokens: int
    spans: list[Span]
    exact: bool  # token spans from the tokenizer (True) or message spans from the text (False)
    truncated_tokens: int = 0

    def to_dict(self) -> dict:
        return {
            "line": self.line,
            "record": self.number,
            "target_tokens": self.target_tokens,
            "tokens": self.total_tokens,
            "tokens_exact": self.exact,
            "truncated_tokens": self.truncated_tokens,
            "text": marked_text(self.spans),
        }


# ----------------------------------------------------------------------------- spans


def token_spans(record: TokenizedRecord, decode) -> list[Span]:
    """Group consecutive tokens of equal weight and decode each group (`decode(ids) -> str`)."""
    spans: list[Span] = []
    start = 0
    for i in range(1, len(record.input_ids) + 1):
        if i == len(record.input_ids) or record.weights[i] != record.weights[start]:
            spans.append(Span(decode(record.input_ids[start:i]), record.weights[start]))
            start = i
    return spans


def message_spans(record: Record) -> list[Span]:
    """Without a tokenizer: each message as `role: content`, the target contents scored."""
    spans: list[Span] = []
    for i, message in enumerate(record.messages):
        weight = message.weight if i in record.targets else 0.0
        spans.append(Span(f"{message.role}: ", 0.0))
        spans.append(Span(message_text(message), weight))
        spans.append(Span("\n", 0.0))
    return _merge(spans)


def _merge(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for span in spans:
        if merged and merged[-1].weight == span.weight:
            merged[-1] = Span(merged[-1].text + span.text, span.weight)
        elif span.text or span.scored:  # an empty reply is still shown, as [[]]
            merged.append(span)
    return merged


def _weight_mark(weight: float) -> str:
    return "" if weight == 1 else f"×{weight:g}"


def marked_text(spans: list[Span]) -> str:
    """The plain form: scored spans in [[ ]], followed by ×w when their weight is below 1."""
    return "".join(f"{OPEN}{s.text}{CLOSE}{_weight_mark(s.weight)}" if s.scored else s.text for s in spans)


def marked_rich(spans: list[Span]) -> Text:
    """The terminal form: the same brackets, with scored text coloured and context dimmed."""
    text = Text()
    for span in spans:
        if span.scored:
            text.append(OPEN + span.text + CLOSE, style=TARGET_STYLE)
            text.append(_weight_mark(span.weight), style="yellow")
        else:
            text.append(span.text, style=CONTEXT_STYLE)
    return text


# ----------------------------------------------------------------------------- records


def shown_record(number: int, counts: RecordTokens, decode=None) -> ShownRecord:
    """A record's display form; token spans when `decode` and a tokenized record exist."""
    tokenized = counts.tokenized
    if decode is not None and tokenized is not None:
        spans = token_spans(tokenized, decode)
        return ShownRecord(
            counts.record.line, number, tokenized.num_targets, len(tokenized), spans, True, tokenized.truncated_tokens
        )
    return ShownRecord(counts.record.line, number, counts.target, counts.total, message_spans(counts.record), False)


def print_records(console, shown: list[ShownRecord]) -> None:
    """Print records one after another, each under a header with its line and target count."""
    for item in shown:
        about = "" if item.exact else "about "
        header = f"record {item.number} · line {item.line} · {about}{item.target_tokens} of {item.total_tokens} tokens scored"
        if item.truncated_tokens:
            header += f" · {item.truncated_tokens} context tokens cut from the left"
        console.rule(header, align="left", style="cyan")
        console.print(marked_rich(item.spans), markup=False, highlight=False, soft_wrap=True)
