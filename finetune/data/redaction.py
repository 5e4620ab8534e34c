"""What a run writes of the user's data with sensitive_data redact: placeholders, never a value (issue 42).

    line = redact_line(line)          # a JSONL line with placeholders in its strings, in its own format
    row = redact_document(row)        # a chat row (the replay mix), or any JSON value
    entries = skipped_as_kept(skipped, setting)   # lines --skip-invalid left out (OUT/skipped.jsonl, the cache)

Tokenizing reads conversations and redacts their messages (sensitive.py). The copies a run keeps of the data (the
test split's train.jsonl and test.jsonl, the replay mix, skipped lines) are written through these instead: every
string of a line, the fields no reader trains on included, so no copy holds a value the file it came from held.
"""

from __future__ import annotations

import json
import re

from finetune.data.sensitive import find_spans, redact_text


def redact_document(value):
    """A JSON value with the sensitive values in each of its strings replaced by placeholders (keys, numbers and
    the structure stay)."""
    if isinstance(value, str):
        return redact_text(value, find_spans(value))
    if isinstance(value, dict):
        return {key: redact_document(item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_document(item) for item in value]
    return value


def redact_line(line: str) -> str:
    """One line of a JSONL file, redacted: each JSON string in it rewritten with placeholders and everything else
    left as it was (the format, the spacing, a duplicate key a reader refuses); a line that is not JSON (one a
    reader skips as invalid) as text."""
    redacted = _STRING.sub(_redact_string, line)
    return redacted if _is_json(line) else redact_text(redacted, find_spans(redacted))


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')  # a JSON string literal, its escapes included


def _redact_string(match: re.Match) -> str:
    try:
        text = json.loads(match.group())
    except ValueError:  # not a string literal after all (a line that is not JSON)
        return match.group()
    spans = find_spans(text)
    return json.dumps(redact_text(text, spans), ensure_ascii=False) if spans else match.group()


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def redact_skipped(entry: dict) -> dict:
    """A skipped line's entry with placeholders in its text and in its problems' messages (which may quote it)."""
    return entry | {"text": redact_line(entry.get("text", "")), "problems": redact_document(entry.get("problems", []))}


def skipped_as_kept(skipped: list[dict], sensitive_data: str) -> list[dict]:
    """Lines --skip-invalid left out (conversations or pairs), as the token cache and OUT/skipped.jsonl keep them:
    with placeholders where they held sensitive values (redact), as every copy of the data."""
    return [redact_skipped(entry) for entry in skipped] if sensitive_data == "redact" else skipped
