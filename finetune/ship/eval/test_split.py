"""`finetune train --test-fraction F`: hold out whole conversations as a test set, before anything else sees them.

The test conversations are cut from the training file first, by a hash of ("test", seed, conversation)
(the validation split ranks by (seed, conversation): the two draws differ), so they are in neither
training nor validation. Duplicates of a conversation go together. The run folder records it:

    OUT/test.jsonl          the held-out lines, as they were in the file (`finetune eval OUT` reads it)
    OUT/train.jsonl         the remaining lines: what training and validation were cut from
    OUT/test_split.json     source file, fraction, seed, conversations held out and their line numbers

With sensitive_data redact both copies are written from the parsed conversations with placeholders where the file
held values (sensitive.py), as OpenAI chat lines (`finetune convert`'s): what they hold is what the tokens hold,
whatever shape a value had in the file (a JSON number in a tool call's arguments, an address split over two content
parts). A line the readers left out (--skip-invalid) keeps its place, redacted as text (data/redaction.py). The test
set is then what the tuned model learned to answer, and no copy keeps a value (docs/sensitive-data.md).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
from pathlib import Path

from finetune.data.convert import conversation_to_openai
from finetune.data.prepare import read_conversations
from finetune.data.redaction import redact_line
from finetune.data.sensitive import redacted, refuse_if_found, scan_conversations, summarize
from finetune.settings.errors import UserError

TEST_FILE, TRAIN_FILE, RECORD_FILE = "test.jsonl", "train.jsonl", "test_split.json"
SALT = "test"


def _rank(seed: int, key: tuple) -> str:
    payload = json.dumps([SALT, seed, key], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    # a name without an extension (the job service keeps uploads as files/<id>, gzip stored decompressed) is read
    # as JSON Lines unless it holds a JSON array
    plain = not Path(path).suffix and not _starts_an_array(path)
    if not path.endswith((".jsonl", ".jsonl.gz")) and not plain:
        raise UserError(f"--test-fraction needs a JSONL training file; split {path} yourself and pass --test to eval")
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def _starts_an_array(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")


def _write(path: Path, lines: list[str]) -> None:
    """Atomically (every process of a multi-device run writes the same content)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def hold_out_test(config, out: Path):
    """Write the test and remaining training files to OUT; returns the config reading the remaining file."""
    if not config.data:
        raise UserError("no training file given")
    conversations, _ = read_conversations(config.data, config.format, config.skip_invalid)
    if config.sensitive_data == "refuse":  # stop before OUT/test.jsonl holds anything, as preparing would stop
        refuse_if_found(summarize(scan_conversations(conversations)[1], Path(config.data).name, "refuse"))
    groups: dict[tuple, list[int]] = {}
    for conversation in conversations:
        groups.setdefault(conversation.key(), []).append(conversation.line)
    if len(groups) < 2:
        raise UserError(f"--test-fraction: {config.data} has {len(groups)} distinct conversation(s); need at least 2")
    n_test = min(len(groups) - 1, max(1, round(config.test_fraction * len(groups))))
    ranked = sorted(groups, key=lambda key: _rank(config.seed, key))
    test_lines = sorted(line for key in ranked[:n_test] for line in groups[key])
    held = set(test_lines)
    lines = _lines(config.data)
    redact = config.sensitive_data == "redact"
    if redact:
        lines = _redacted_lines(lines, conversations)
    out.mkdir(parents=True, exist_ok=True)
    _write(out / TEST_FILE, [lines[n - 1] for n in test_lines])
    _write(out / TRAIN_FILE, [line for n, line in enumerate(lines, start=1) if n not in held])
    record = {
        "source": str(config.data),
        "fraction": config.test_fraction,
        "seed": config.seed,
        "conversations": len(test_lines),
        "distinct_conversations": n_test,
        "lines": test_lines,
        "rule": "ranked by sha256(['test', seed, conversation]); validation is cut afterwards from train.jsonl",
        "redacted": config.sensitive_data == "redact",
    }
    (out / RECORD_FILE).write_text(json.dumps(record, indent=2))
    return dataclasses.replace(config, data=str(out / TRAIN_FILE), **({"format": "chat"} if redact else {}))


def _redacted_lines(lines: list[str], conversations: list) -> list[str]:
    """The file's lines, each conversation written from its parsed, redacted form (OpenAI chat JSON), each line no
    reader parsed redacted as it stands (redaction.py): no line keeps a value, in whatever form the file held it."""
    written = {c.line: json.dumps(conversation_to_openai(c), ensure_ascii=False) for c in redacted(conversations)}
    return [written.get(number) or redact_line(line) for number, line in enumerate(lines, start=1)]


def held_out_lines(out: Path) -> set[int]:
    """The training file's lines the run in `out` held out as its test split (none without one)."""
    path = out / RECORD_FILE
    return set(json.loads(path.read_text())["lines"]) if path.is_file() else set()
