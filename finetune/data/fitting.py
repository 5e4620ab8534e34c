"""Records longer than the limit: the one policy `validate`, `plan`, `train` and the service apply, and its summary.

    kept, dropped = fit_tokenized(record, chat, max_seq_len, truncation)  # with the model's tokenizer
    parts = fit(record, total, max_seq_len, truncation, measure)            # the same decision, any measure
    summary = LongRecords(...); summary.warnings(); summary.strict_error()

The policy (docs/formats.md, "Long conversations"): a record that fits is kept whole. With `truncation`
left (the default), an over-long record is split at turn boundaries into consecutive records that fit
(records.fit_record): under the `all` policy a conversation becomes as many records as needed, each scoring
its replies once; under `last` and `each` the record keeps its one reply and as many earlier turns as fit.
Only a part whose reply, with the turn that prompts it, is over the limit by itself has its context cut from
the left (never a scored token) or, when even that would cut the reply, is dropped. With `truncation` drop an
over-long record is dropped whole. `strict` turns any of that into an error naming FILE:LINE.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum

from finetune.data.records import fit_record
from finetune.data.tokenize import cut_to_length
from finetune.data.types import Record
from finetune.settings.data_choices import Truncation
from finetune.settings.wording import ref

SHOWN_LINES = 3  # FILE:LINEs a summary names before "and N more"
# The summary's warning codes: `validate` reports them, and the plan's advice (docs/auto.md, docs/formats.md)
CONVERSATIONS_SPLIT = "conversations_split"
TRUNCATED_EXAMPLES = "truncated_examples"
DROPPED_EXAMPLES = "dropped_examples"


class Fit(IntEnum):
    """What the limit did to a kept record (stored per record in the token cache)."""

    WHOLE = 0  # fits as it is
    SPLIT = 1  # one of the records an over-long conversation was split into
    SHORTENED = 2  # kept its reply (or replies) but not all of its earlier context


def fit(
    record: Record, total: int, max_seq_len: int, truncation: Truncation | str, measure: Callable[[Record], int]
) -> list[tuple[Record, Fit]] | None:
    """The records `record` (`total` tokens) becomes under the limit, each with its Fit; None: dropped whole
    (truncation drop). A returned part may still be over the limit (one reply alone): fit it with a cut."""
    if total <= max_seq_len:
        return [(record, Fit.WHOLE)]
    if Truncation(truncation) is Truncation.DROP:
        return None
    parts = fit_record(record, max_seq_len, measure)
    kind = Fit.SPLIT if len(parts) > 1 else Fit.SHORTENED
    return [(part, kind) for part in parts]


def fit_tokenized(record: Record, chat, max_seq_len: int, truncation: Truncation | str, whole=None):
    """`fit` with a ChatTokenizer: ([(part, EncodedOutcome, Fit)] kept, [(part, EncodedOutcome)] dropped).

    Every candidate part is tokenized whole once (`whole`: the record's own, when the caller has it) and cut
    from its arrays, so an over-long record costs one tokenization per part the search looks at.
    """
    measured = {(record.messages, record.targets): whole or chat.tokenize_whole(record)}

    def whole_of(part: Record):
        key = (part.messages, part.targets)
        if key not in measured:
            measured[key] = chat.tokenize_whole(part)
        return measured[key]

    total = whole_of(record).total_tokens
    parts = fit(record, total, max_seq_len, truncation, lambda part: whole_of(part).total_tokens)
    if parts is None:
        return [], [(record, cut_to_length(whole_of(record), max_seq_len, truncation))]
    kept, dropped = [], []
    for part, kind in parts:
        outcome = cut_to_length(whole_of(part), max_seq_len, Truncation.LEFT)
        if outcome.input_ids is None:
            dropped.append((part, outcome))
        else:
            kept.append((part, outcome, kind))
    return kept, dropped


# ----------------------------------------------------------------------------- the summary


def in_file_order(places: Iterable[str]) -> list[str]:
    """FILE:LINE places by line within each file, the files in the order they first appear (the training file
    before a validation file): records are fitted side by side, the training side's first."""
    places = list(places)
    files = {place.rpartition(":")[0]: None for place in places}
    rank = {name: i for i, name in enumerate(files)}
    return sorted(places, key=lambda place: (rank[place.rpartition(":")[0]], _file_order(place)[1]))


def dropped_lines(dropped: list[tuple[int, int]], val_file: str | None) -> tuple[int, ...]:
    """The line numbers of the dropped records, given as (side: 0 training, 1 validation; line), in file order:
    one file's lines sorted, or, with a separate validation file, the training file's then the validation file's."""
    return tuple(line for _, line in sorted(dropped, key=lambda d: (d[0] if val_file else 0, d[1])))


def where(places: list[str]) -> str:
    """'a.jsonl:2, a.jsonl:9, a.jsonl:17 and 4 more', in file order."""
    places = in_file_order(places)
    shown = ", ".join(places[:SHOWN_LINES])
    return shown + (f" and {len(places) - SHOWN_LINES:,} more" if len(places) > SHOWN_LINES else "")


def _records(n: int, noun: str = "record") -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


@dataclass
class LongRecords:
    """What the limit did to the data, as FILE:LINE lists (file order): the one summary every command gives."""

    max_seq_len: int
    truncation: str = str(Truncation.LEFT)
    split_at: list[str] = field(default_factory=list)  # conversations split into several records
    split_records: int = 0  # the records they became (those kept)
    shortened_at: list[str] = field(default_factory=list)  # records that kept their replies, not all context
    dropped_at: list[str] = field(default_factory=list)
    dropped_need: int = 0  # tokens the longest dropped record would need
    longest: int = 0  # tokens of the longest record before fitting (what --strict asks for)

    def note(self, place: str, parts: int, kept: int, dropped_tokens: list[int]) -> None:
        """What fitting one over-long record did: cut into `parts` records, `kept` of them, the others dropped
        (their lengths in tokens)."""
        for tokens in dropped_tokens:
            self.dropped_at.append(place)
            self.dropped_need = max(self.dropped_need, tokens)
        if kept and parts > 1:
            self.split_at.append(place)
            self.split_records += kept
        elif kept:
            self.shortened_at.append(place)

    @property
    def anything(self) -> bool:
        return bool(self.split_at or self.shortened_at or self.dropped_at)

    def warnings(self) -> list[tuple[str, str]]:
        """(code, message) for each thing that happened; the codes are the plan's (docs/auto.md)."""
        limit = f"{self.max_seq_len:,} tokens"
        found = []
        if self.split_at:
            found.append(
                (
                    CONVERSATIONS_SPLIT,
                    f"{_records(len(self.split_at), 'conversation')} longer than {limit} split into "
                    f"{_records(self.split_records)} (each reply scored once, with as much earlier context as "
                    f"fits): {where(self.split_at)}",
                )
            )
        if self.shortened_at:
            found.append(
                (
                    TRUNCATED_EXAMPLES,
                    f"{_records(len(self.shortened_at))} longer than {limit} shortened to fit (earlier turns left "
                    f"out, or the start of a long message cut; replies kept): {where(self.shortened_at)}",
                )
            )
        if self.dropped_at:
            n = len(self.dropped_at)
            if Truncation(self.truncation) is Truncation.DROP:
                why = f"longer than {limit} ({ref('truncation', 'drop')})"
            else:
                why = (
                    f"one reply with the turn that prompts it is longer than {limit} by itself; {ref('max_seq_len')} "
                    f"{self.dropped_need:,} would keep {'it' if n == 1 else 'them'}"
                )
            found.append((DROPPED_EXAMPLES, f"{_records(n)} dropped ({why}): {where(self.dropped_at)}"))
        return found

    def sentence(self) -> str:
        """The summary as one sentence: '2 conversations ... split into 5 records ...; 1 record dropped ...'."""
        return "; ".join(message for _, message in self.warnings())

    def strict_error(self, limit_reason: str | None = None) -> str | None:
        """The error of --strict when anything was split, shortened or dropped (None when nothing was)."""
        if not self.anything:
            return None
        places = sorted(set(self.split_at + self.shortened_at + self.dropped_at), key=_file_order)
        why = f" ({limit_reason})" if limit_reason else ""
        return (
            f"{where(places)}: longer than the {self.max_seq_len:,}-token limit{why}, so "
            f"{_records(len(places), 'line')} would be split, shortened or dropped, and {ref('strict')} forbids that; "
            f"raise {ref('max_seq_len')} to at least {self.longest:,}, or leave {ref('strict')} off"
        )


def strict_line_message(total: int, max_seq_len: int, outcome: str) -> str:
    """validate --strict's error for one line: `outcome` is what the policy would do ('split into 3 records')."""
    return (
        f"{total:,} tokens, longer than the {max_seq_len:,}-token limit: this record would be {outcome}, and "
        f"{ref('strict')} forbids that; raise {ref('max_seq_len')} to at least {total:,}, or leave {ref('strict')} off"
    )


def _file_order(place: str) -> tuple[str, int]:
    name, _, line = place.rpartition(":")
    return name, int(line) if line.isdigit() else 0
