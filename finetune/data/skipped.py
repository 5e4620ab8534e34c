"""`--skip-invalid`: keep the usable lines of a file, and account for every line left out.

    conversations, skipped = usable_conversations(parsed, skip_invalid=True)
    write_skipped(Path(out), skipped)        # OUT/skipped.jsonl, one line per skipped line

Each skipped line is written with its file, line number, codes, messages and its original text, so
nothing the user gave is dropped silently. Problems of the whole file (an empty file, a byte-order mark,
a UTF-16 file) cannot be skipped around: they stop the run with or without the flag.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from finetune.data.formats.lines import BOM
from finetune.data.read import load_bytes, problems_text, split_lines
from finetune.data.types import Conversation, ParsedFile
from finetune.settings.errors import UserError
from finetune.settings.wording import ref

SKIPPED_FILE = "skipped.jsonl"
# Reported on line 1, but a problem of the file's encoding: no line can be left out to get around it.
WHOLE_FILE_CODES = frozenset({BOM})


def usable_conversations(parsed: ParsedFile, skip_invalid: bool) -> tuple[list[Conversation], list[dict]]:
    """The conversations to train on, and the skipped lines; UserError when the file cannot be used."""
    if parsed.ok:
        return parsed.conversations, []
    problems = problems_text(parsed)
    if not skip_invalid:
        raise UserError(f"{problems}\nOr pass {ref('skip_invalid')} to train on the valid lines only.")
    if any(p.line is None or p.code in WHOLE_FILE_CODES for p in parsed.errors):
        raise UserError(f"{problems}\n{ref('skip_invalid')} skips lines; it cannot skip a problem of the whole file.")
    if not parsed.conversations:
        raise UserError(
            f"{problems}\n{ref('skip_invalid')}: no line of the file is valid, so there is nothing to train on."
        )
    return parsed.conversations, skipped_lines(parsed)


def skipped_lines(parsed: ParsedFile) -> list[dict]:
    """One entry per line with an error: {"file", "line", "codes", "problems", "text"}."""
    by_line: dict[int, list] = {}
    for problem in parsed.errors:
        by_line.setdefault(problem.line, []).append(problem)
    texts = _line_texts(parsed.path, set(by_line))
    return [
        {
            "file": parsed.path,
            "line": line,
            "codes": sorted({p.code for p in problems}),
            "problems": [{"code": p.code, "message": p.message} for p in problems],
            "text": texts.get(line, ""),
        }
        for line, problems in sorted(by_line.items())
    ]


def _line_texts(path: str, numbers: set[int]) -> dict[int, str]:
    """The original text of the given lines (undecodable bytes shown as escapes)."""
    try:
        data = load_bytes(path)
    except UserError:
        return {}
    return {
        number: raw.decode("utf-8", "backslashreplace").removeprefix("\ufeff")
        for number, raw in enumerate(split_lines(data), start=1)
        if number in numbers
    }


def write_skipped(out: Path, skipped: list[dict]) -> Path | None:
    """Write OUT/skipped.jsonl (atomically); None when nothing was skipped."""
    if not skipped:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / SKIPPED_FILE
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8") as handle:
        for entry in skipped:
            handle.write(json.dumps(entry, ensure_ascii=True) + "\n")
    os.replace(partial, path)
    return path
