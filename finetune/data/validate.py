"""`finetune validate`: is this file usable for training, and what will the model learn from it?

    finetune validate FILE [--model DIR] [--show N] [--max-seq-len L|auto] [--record-policy all|last|each]
                           [--truncation left|drop] [--strict] [--format chat|prompt_completion|sharegpt|alpaca] [--json]

Every problem is reported (never only the first) as `FILE:LINE [code] message`; the codes are listed
in docs/formats.md. Exit code 0 when the file is usable (warnings allowed), 1 when it is not.
Without --model, token numbers are estimates and torch/transformers are not imported; with --model,
they are exact and the masks are proven before any training: every record scores something, the
end-of-turn token is scored. Records longer than the limit are fitted to it exactly as training fits them
(fitting.py: split, shortened, or dropped when one reply alone is too long) and summed up in the same
warnings the plan gives; with --strict each is an error instead.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from finetune.data.fitting import Fit, LongRecords, fit, fit_tokenized, strict_line_message
from finetune.data.formats.lines import DUPLICATE
from finetune.data.invented import checked
from finetune.data.read import duplicates_summary, find_duplicates, read_file
from finetune.data.sensitive import SENSITIVE_DATA, scanned_file  # noqa: F401 (SENSITIVE_DATA: one of its codes)
from finetune.data.seq_len import choose_max_seq_len
from finetune.data.show import ShownRecord, print_records, shown_record
from finetune.data.stats import RecordTokens, build_all_records, estimate_record_tokens, summarize
from finetune.data.tokenize import ChatTokenizer, as_lists, describe_tool_features, load_tokenizer, tool_needs
from finetune.data.types import IGNORE_INDEX, ParsedFile, Problem, Record
from finetune.settings import (
    config as configuration,  # (not AUTO by name: this module's upper-case strings are its codes)
)
from finetune.settings.config import RunConfig
from finetune.settings.data_choices import RecordPolicy, Truncation
from finetune.settings.errors import RecordError, UserError
from finetune.settings.wording import ref, render, rendered

# Codes found with the model's tokenizer (the reader's codes live in finetune.data.read).
TOO_LONG = "too_long"  # error with --strict only: the record would be split, shortened or dropped
NOTHING_TRAINABLE = "nothing_trainable"  # every record was dropped: a reply alone is over the limit in each
NO_TARGET_TOKENS = "no_target_tokens"
FIRST_TOKEN_SCORED = "first_token_scored"
END_OF_TURN_NOT_SCORED = "end_of_turn_not_scored"
TEMPLATE_MISMATCH = "template_mismatch"
TEMPLATE_CANNOT_RENDER_TOOLS = "template_cannot_render_tools"
DUPLICATES_LISTED = 1000  # --json's "duplicates" lists this many copies at most (the count is exact)

POLICY_MEANING = {
    RecordPolicy.ALL: "one record per conversation, every weighted reply scored",
    RecordPolicy.LAST: "one record per conversation, only the last reply scored",
    RecordPolicy.EACH: "one record per weighted reply",
}


@dataclass
class Validation:
    """The outcome of validating one file: what `--json` prints, plus the counted records."""

    path: str
    format: str | None
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    counts: list[RecordTokens] = field(default_factory=list)  # the records training would take, fitted to the limit
    duplicates: list[tuple[int, int]] = field(default_factory=list)  # (line, line of its first copy)
    sensitive: dict | None = None  # sensitive values found (data/sensitive.py): counts, lines, places, no value
    invented: dict | None = None  # specifics replies state that their conversation never gave (data/invented.py)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        document = {
            "ok": self.ok,
            "errors": [p.to_dict() for p in self.errors],
            "warnings": [p.to_dict() for p in self.warnings],
            "stats": self.stats,
        }
        if self.duplicates:
            listed = [{"line": line, "same_as": first} for line, first in self.duplicates[:DUPLICATES_LISTED]]
            document["duplicates"] = {"count": len(self.duplicates), "lines": listed}
        document |= {"sensitive_data": self.sensitive} if self.sensitive and self.sensitive["total"] else {}
        return document | ({"invented_specifics": self.invented} if self.invented and self.invented["total"] else {})


# ----------------------------------------------------------------------------- library


def validate_file(
    path: str,
    tokenizer=None,
    max_seq_len: int | str = configuration.AUTO,
    record_policy: RecordPolicy | str = RecordPolicy.ALL,
    format: str | None = None,
    config: RunConfig | None = None,
) -> Validation:
    """Read and check `path`; with a tokenizer, count tokens exactly and prove the masks (see validate_parsed)."""
    return validate_parsed(read_file(path, format), tokenizer, max_seq_len, record_policy, config)


def validate_parsed(
    parsed: ParsedFile,
    tokenizer=None,
    max_seq_len: int | str = configuration.AUTO,
    record_policy: RecordPolicy | str = RecordPolicy.ALL,
    config: RunConfig | None = None,
) -> Validation:
    """Build the records of a read file, count their tokens, fit them to the limit as training would
    (fitting.py: split, shortened or dropped, summed up as warnings; errors with `strict`), and, with a
    tokenizer, prove the masks.

    `config`: the run's settings when there is a run (max_seq_len, record_policy, truncation, strict, and what
    Auto's limit looks at: the model and the device); without one, `max_seq_len` and `record_policy`."""
    config = config or RunConfig(max_seq_len=max_seq_len, record_policy=record_policy)
    policy = RecordPolicy(config.record_policy)
    parsed, found = scanned_file(parsed, config.sensitive_data)  # with redact, placeholders in place of the values
    duplicates = find_duplicates(parsed.conversations)
    warnings = _with_duplicates_summarised(parsed.warnings, duplicates)
    result = Validation(parsed.path, parsed.format, list(parsed.errors), warnings, duplicates=duplicates)
    result.sensitive = found
    result.invented, invented_warning = checked(parsed.conversations, Path(parsed.path).name)  # what is trained on
    result.warnings += [invented_warning] if invented_warning else []
    records = build_all_records(parsed.conversations, policy)
    chat = None
    if tokenizer is None:
        whole = [estimate_record_tokens(r, 0).total for r in records]
    else:
        chat = ChatTokenizer(tokenizer)  # UserError when the template never closes a reply with a special token
        records = _without_unrenderable_tools(records, chat, result)
        records, whole = _tokenize_whole(records, chat, result)
    limit = choose_max_seq_len(config, np.array([_total(w) for w in whole], dtype=np.int64))
    long = LongRecords(limit.value, str(config.truncation), longest=max((_total(w) for w in whole), default=0))
    name = Path(parsed.path).name
    over = 0
    for record, measured in zip(records, whole, strict=True):
        over += _total(measured) > limit.value
        try:
            kept = _fit(record, measured, chat, limit.value, config, long, f"{name}:{record.line}", result)
        except RecordError as exc:  # a part the template refuses (the whole record it rendered)
            result.errors.append(Problem(exc.line, TEMPLATE_MISMATCH, exc.reason))
            continue
        result.counts += kept
    if not config.strict:
        result.warnings += [Problem(None, code, message) for code, message in long.warnings()]
    if records and not result.counts and long.dropped_at:
        result.errors.append(Problem(None, NOTHING_TRAINABLE, f"nothing trainable remains: {long.sentence()}"))
    if chat is not None:
        _check_masks(result, chat.end_of_turn_id, chat.end_of_turn_text)
    result.stats = {"format": parsed.format} | summarize(
        parsed.conversations, result.counts, policy, limit.value, tokenizer is not None
    )
    result.stats |= {"max_seq_len_reason": limit.reason or None, "over_max_seq_len": _over(over, result.counts)}
    result.stats["long_records"] = {
        "split_conversations": len(long.split_at),
        "split_records": long.split_records,
        "shortened_records": len(long.shortened_at),
        "dropped_records": len(long.dropped_at),
    }
    result.errors.sort(key=_file_order)
    result.warnings.sort(key=_file_order)
    return result


def _total(measured) -> int:
    return measured if isinstance(measured, int) else measured.total_tokens


def _over(records: int, counts: list[RecordTokens]) -> dict:
    """The records built longer than the limit, and the context tokens fitting them cut inside a message."""
    return {"records": records, "tokens_cut": sum(c.cut for c in counts)}


def _tokenize_whole(records: list[Record], chat, result: Validation) -> tuple[list[Record], list]:
    """Each record tokenized whole, never cut; a record the template refuses is an error, and left out."""
    kept, whole = [], []
    for record in records:
        try:
            whole.append(chat.tokenize_whole(record))
        except RecordError as exc:  # the template refuses the record, or does not reproduce a reply verbatim
            result.errors.append(Problem(exc.line, TEMPLATE_MISMATCH, exc.reason))
            continue
        kept.append(record)
    return kept, whole


def _fit(
    record: Record, measured, chat, limit: int, config: RunConfig, long: LongRecords, place: str, result: Validation
) -> list[RecordTokens]:
    """The record fitted to the limit as training would (fitting.py): its kept parts counted; what happened
    noted in `long`, or, with --strict, an error on its line."""
    total = _total(measured)
    if chat is None:
        parts = fit(record, total, limit, config.truncation, lambda part: estimate_record_tokens(part, 0).total)
        kept, dropped = [], []
        for part, kind in parts or []:
            counted = estimate_record_tokens(part, limit)
            (dropped if counted.dropped else kept).append((counted, kind))
        if parts is None:
            dropped.append((estimate_record_tokens(record, limit), Fit.WHOLE))
    else:
        kept_outcomes, dropped_outcomes = fit_tokenized(record, chat, limit, config.truncation, measured)
        kept = [(_exact_counts(part, outcome), kind) for part, outcome, kind in kept_outcomes]
        dropped = [(RecordTokens(part, o.total_tokens, 0, o.cut_tokens, dropped=o.dropped), Fit.WHOLE)
                   for part, o in dropped_outcomes]  # fmt: skip
    if total <= limit:
        return [counts for counts, _ in kept]
    parts_made = len(kept) + len(dropped)
    if config.strict:
        what = f"split into {parts_made} records" if parts_made > 1 else "shortened"
        if dropped:
            what = "dropped" if parts_made == 1 else what + f", {len(dropped)} of them dropped"
        result.errors.append(Problem(record.line, TOO_LONG, strict_line_message(total, limit, what)))
    long.note(place, parts_made, len(kept), [counts.total for counts, _ in dropped])
    return [counts for counts, _ in kept]


def _exact_counts(part: Record, outcome) -> RecordTokens:
    """A kept part's numbers: its length before any cut, its scored tokens (a cut never takes one)."""
    targets = int((outcome.weights > 0).sum())
    return RecordTokens(part, outcome.total_tokens, targets, outcome.cut_tokens, as_lists(part, outcome).record)


def _with_duplicates_summarised(warnings: list[Problem], duplicates: list[tuple[int, int]]) -> list[Problem]:
    """The reader's warnings with its one-per-copy `duplicate` warnings made one, at the first copy's line."""
    warnings = [p for p in warnings if p.code != DUPLICATE]
    copies = [line for line, _ in duplicates]
    if copies:
        warnings.append(Problem(copies[0], DUPLICATE, duplicates_summary(len(copies), copies)))
    return warnings


def _file_order(problem: Problem) -> tuple[bool, int]:
    return problem.line is not None, problem.line or 0  # whole-file problems first, then by line (stable)


def _without_unrenderable_tools(records: list[Record], chat, result: Validation) -> list[Record]:
    """One error for every record that uses tools the template cannot render (named by its first line)."""
    missing: set[str] = set()
    lines: list[int] = []
    kept = []
    for record in records:
        lacking = tool_needs(record.messages, record.tools) - chat.tool_support
        if lacking:
            missing |= lacking
            if not lines or lines[-1] != record.line:
                lines.append(record.line)
        else:
            kept.append(record)
    if lines:
        result.errors.append(
            Problem(
                lines[0],
                TEMPLATE_CANNOT_RENDER_TOOLS,
                f"the model's chat template cannot render {describe_tool_features(missing)}, "
                f"which {_count(len(lines), 'line')} use (first: line {lines[0]}); use a model whose template "
                "supports tools (e.g. Qwen2.5, Llama 3.1 Instruct), or remove the tools",
            )
        )
    return kept


def _check_masks(result: Validation, end_of_turn_id: int, end_of_turn_text: str) -> None:
    """The pre-flight proof that training will learn what the file says, before any GPU time is spent."""
    trained = [c.tokenized for c in result.counts if c.tokenized is not None]
    for record in trained:
        if record.num_targets == 0:
            result.errors.append(
                Problem(record.line, NO_TARGET_TOKENS, "this record has no scored tokens after tokenization")
            )
        elif record.labels[0] != IGNORE_INDEX:
            result.errors.append(
                Problem(record.line, FIRST_TOKEN_SCORED, "the first token is scored, but nothing comes before it")
            )
    if trained and not any(end_of_turn_id in r.labels for r in trained):
        result.errors.append(
            Problem(
                None,
                END_OF_TURN_NOT_SCORED,
                f"the end-of-turn token {end_of_turn_text} is never scored: the model would not learn to stop",
            )
        )


# ----------------------------------------------------------------------------- command


def run_validate(
    file: str,
    model: str | None = None,
    show: int = 0,
    as_json: bool = False,
    max_seq_len: int | str = configuration.AUTO,
    record_policy: str = "all",
    format: str | None = None,
    truncation: str = "left",
    strict: bool = False,
    chat_template: str = "auto",
    trust_remote_code: bool = False,
    sensitive_data: str = "warn",
) -> int:
    """The `finetune validate` command: print the report; 0 when the file is usable, 1 when not."""
    _check_flags(show, max_seq_len, record_policy, truncation)
    parsed = read_file(file, format)  # a missing file is reported before a model is loaded
    tokenizer = None
    if model is not None:
        tokenizer = load_tokenizer(model, trust_remote_code, chat_template)
    config = RunConfig(model=model, max_seq_len=max_seq_len, record_policy=record_policy, truncation=truncation,
                       strict=strict, sensitive_data=sensitive_data)  # fmt: skip
    result = validate_parsed(parsed, tokenizer, config=config)
    shown = _shown(result, show, tokenizer)
    if as_json:
        document = result.to_dict() | ({"shown": [s.to_dict() for s in shown]} if show else {})
        print(json.dumps(rendered(document), ensure_ascii=True))  # ASCII: safe whatever the terminal's encoding
    else:
        forced = format not in (None, "auto")
        _print_report(result, shown, show, render(ref("format")) if forced else "detected")
    return 0 if result.ok else 1


def _check_flags(show: int, max_seq_len: int | str, record_policy: str, truncation: str) -> None:
    if show < 0:
        raise UserError(f"--show must be 0 or more, got {show}")
    if max_seq_len != configuration.AUTO and (not isinstance(max_seq_len, int) or max_seq_len < 1):
        raise UserError(f"{ref('max_seq_len')} must be at least 1 or 'auto', got {max_seq_len}")
    if record_policy not in set(RecordPolicy):
        raise UserError(f"{ref('record_policy')} must be one of {', '.join(RecordPolicy)}, got {record_policy!r}")
    if truncation not in set(Truncation):
        raise UserError(f"{ref('truncation')} must be one of {', '.join(Truncation)}, got {truncation!r}")


def _shown(result: Validation, show: int, tokenizer) -> list[ShownRecord]:
    decode = None
    if tokenizer is not None:

        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    return [shown_record(i, counts, decode) for i, counts in enumerate(result.counts[:show], start=1)]


# ----------------------------------------------------------------------------- human output


def _print_report(result: Validation, shown: list[ShownRecord], show: int, how: str) -> None:
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")  # a terminal that cannot show a character gets '?', not a crash
    console = Console(highlight=False, soft_wrap=True)  # one problem per line, greppable
    path = _printable(result.path)
    _print_problems(console, path, "errors", result.errors, "red")
    _print_problems(console, path, "warnings", result.warnings, "yellow")
    console.print(f"format: {result.stats['format'] or 'unknown'} ({how})", markup=False)
    console.print(_stats_table(result.stats))
    if show:
        _print_shown(console, shown, show, result.stats["tokens_exact"])
    if not result.stats["tokens_exact"]:
        console.print(
            render(
                f"≈ token numbers are estimates (about 4 bytes of text per token); pass {ref('model', 'DIR')} for "
                "exact counts and to prove the masks (scored tokens, end-of-turn, truncation)."
            ),
            markup=False,
        )
    _print_verdict(console, path, result)


def _print_problems(console: Console, path: str, title: str, problems: list[Problem], style: str) -> None:
    if not problems:
        return
    console.print(f"{title} ({len(problems)}):", style=f"bold {style}", markup=False)
    for p in problems:
        where = f"{path}:{p.line}" if p.line is not None else path
        console.print(f"{where} [{p.code}] {render(p.message)}", style=style, markup=False)


def _stats_table(stats: dict) -> Table:
    about = "" if stats["tokens_exact"] else "≈ "
    lengths = stats["record_tokens"]
    over = stats["over_max_seq_len"]
    policy = RecordPolicy(stats["record_policy"])
    table = Table(title="what the file holds", title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column(style="dim")
    table.add_row("conversations", f"{stats['conversations']:,}", "usable lines of the file")
    table.add_row("messages", f"{stats['messages']:,}", "all roles, all turns: not what training counts")
    table.add_row(
        "training records", f"{stats['records']:,}", f"what steps count: policy {policy}, {POLICY_MEANING[policy]}"
    )
    table.add_row("target tokens", f"{about}{stats['target_tokens']:,}", "scored: what the model learns")
    table.add_row("context tokens", f"{about}{stats['context_tokens']:,}", "read, never scored")
    table.add_row(
        "record length",
        f"{about}{lengths['max']:,}",
        f"tokens, max (p50 {lengths['p50']:,} · p90 {lengths['p90']:,} · p95 {lengths['p95']:,})",
    )
    table.add_row(
        "max sequence length",
        f"{stats['max_seq_len']:,}",
        f"tokens: {render(stats['max_seq_len_reason'] or 'your ' + ref('max_seq_len'))}",
    )
    long = stats["long_records"]
    table.add_row(
        "longer than that",
        f"{over['records']:,}",
        f"records: {long['split_conversations']:,} split into {long['split_records']:,}, "
        f"{long['shortened_records']:,} shortened, {long['dropped_records']:,} dropped (docs/formats.md)",
    )
    return table


def _print_shown(console: Console, shown: list[ShownRecord], show: int, exact: bool) -> None:
    if not shown:
        console.print("\nno records to show", markup=False)
        return
    how = "tokens" if exact else render(f"message text (pass {ref('model')} to see tokens)")
    console.print(f"\nthe first {_count(len(shown), 'record')}, as {how}; scored text in [[ ]]:", markup=False)
    print_records(console, shown)
    if len(shown) < show:
        console.print(f"(there are only {_count(len(shown), 'record')})", markup=False)


def _print_verdict(console: Console, path: str, result: Validation) -> None:
    errors, warnings = len(result.errors), len(result.warnings)
    counted = f"{_count(errors, 'error')}, {_count(warnings, 'warning')}"
    if result.ok:
        console.print(f"OK: {path} is usable ({counted})", style="bold green", markup=False)
    else:
        console.print(f"NOT USABLE: {path} ({counted}); fix the errors above", style="bold red", markup=False)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def _printable(text: str) -> str:
    """A file name from the command line may hold undecodable bytes (surrogate escapes): show them as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
