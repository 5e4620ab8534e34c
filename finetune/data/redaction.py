"""What a run writes of the user's data with sensitive_data redact: placeholders, never a value (issues 42 and 47).

    value = redact_document(value)    # any JSON value: its strings, its keys and its numbers, redacted
    arguments = redact_arguments(arguments)   # a tool call's arguments (a JSON object's text), still JSON
    line = redact_line(line)          # a JSONL line the readers left out (--skip-invalid), in its own shape
    entries = skipped_as_kept(skipped, setting)   # lines --skip-invalid left out (OUT/skipped.jsonl, the cache)

The copies a run keeps of the conversations it reads (the test split's train.jsonl and test.jsonl, the replay mix)
are written from the parsed conversations after sensitive.py replaced their values: what the copy holds is what the
tokens hold. What no reader parsed (a line left out as invalid, and the messages that say why) is redacted here,
value by value, wherever JSON can hold one: a string, an object's key, a number (4111111111111111 is a card whether
quoted or not: it becomes the string "<CARD>"), and text split over the consecutive parts of a list (an e-mail
address in two content parts, which a reader joins, is found in the joined text and cut from both parts).
"""

from __future__ import annotations

import json

from finetune.data.detectors import PLACEHOLDERS, find_spans, redact_text


class _Pairs(list):
    """A JSON object read as its (key, value) pairs: a duplicate key (which a reader refuses) is kept as it was."""


class _Number(str):
    """A JSON number as it was written (no float rounding, no 1.0 for 1)."""


def _redact_number(text: str):
    spans = find_spans(text)
    return PLACEHOLDERS[spans[0].kind] if spans else None


def redact_document(value):
    """A JSON value with every sensitive value in it replaced by a placeholder: in each string and each key, a number
    whose digits are one (as the placeholder string), and text split over the consecutive parts of a list."""
    if isinstance(value, str) and not isinstance(value, _Number):
        return redact_text(value, find_spans(value))
    if isinstance(value, _Number) or (isinstance(value, int | float) and not isinstance(value, bool)):
        placeholder = _redact_number(str(value) if isinstance(value, _Number) else json.dumps(value))
        return value if placeholder is None else placeholder
    if isinstance(value, _Pairs):
        return _Pairs((redact_document(key), _item(key, item)) for key, item in value)
    if isinstance(value, dict):
        return {redact_document(key): _item(key, item) for key, item in value.items()}
    if isinstance(value, list):
        return [redact_document(item) for item in _joined_parts(value)]
    return value


def _item(key: str, item):
    """A tool call's arguments given as a JSON string stay a JSON string (a number in them becomes "<CARD>", not an
    unquoted <CARD> that would make the call unreadable)."""
    if key == "arguments" and isinstance(item, str) and not isinstance(item, _Number):
        return redact_arguments(item)
    return redact_document(item)


def _text_of(item) -> str | None:
    """The text a reader would join of a list's item: a string, or a part's "text"."""
    if isinstance(item, str) and not isinstance(item, _Number):
        return item
    pairs = item if isinstance(item, _Pairs) else list(item.items()) if isinstance(item, dict) else []
    texts = [v for k, v in pairs if k == "text" and isinstance(v, str) and not isinstance(v, _Number)]
    return texts[-1] if texts else None


def _with_text(item, text: str):
    if isinstance(item, str):
        return text
    if isinstance(item, _Pairs):
        return _Pairs((k, text if k == "text" and isinstance(v, str) else v) for k, v in item)
    return item | {"text": text}


def _joined_parts(items: list) -> list:
    """The list with each value that spans consecutive text parts cut out of them: the placeholder where it starts."""
    texts = [_text_of(item) for item in items]
    if sum(text is not None for text in texts) < 2:
        return items
    out = list(items)
    start = 0
    while start < len(items):
        end = start
        while end < len(items) and texts[end] is not None:
            end += 1
        if end - start >= 2:
            out[start:end] = _cut_across(out[start:end], texts[start:end])
        start = end + 1
    return out


def _cut_across(items: list, texts: list[str]) -> list:
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    new = list(texts)
    for span in reversed(find_spans("".join(texts))):
        touched = [i for i, off in enumerate(offsets) if off < span.end and span.start < off + len(texts[i])]
        if len(touched) < 2:
            continue  # inside one part: that part's own redaction finds it
        for i in reversed(touched):
            low, high = max(span.start, offsets[i]) - offsets[i], min(span.end, offsets[i] + len(texts[i])) - offsets[i]
            new[i] = new[i][:low] + (PLACEHOLDERS[span.kind] if i == touched[0] else "") + new[i][high:]
    return [_with_text(item, text) if text != old else item for item, text, old in zip(items, new, texts, strict=True)]


def _parse(text: str):
    return json.loads(text, object_pairs_hook=_Pairs, parse_int=_Number, parse_float=_Number)


def _dump(value) -> str:
    if isinstance(value, _Number):
        return str(value)
    if isinstance(value, _Pairs):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_dump(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dump(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def redact_arguments(arguments: str) -> str:
    """A tool call's arguments (the text of a JSON object) redacted and written out again as JSON; as text when they
    are not JSON (the readers refuse such a call)."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return redact_text(arguments, find_spans(arguments))
    redacted = redact_document(value)
    return arguments if redacted == value else json.dumps(redacted, ensure_ascii=False)


def redact_line(line: str) -> str:
    """One line of a JSONL file, redacted: the very same bytes when it holds no value; else its JSON written out again
    with each value replaced (its keys in their order, a duplicate key kept, each number as it was written); a line
    that is not JSON (one a reader skips as invalid) as text."""
    try:
        value = _parse(line)
    except (ValueError, RecursionError):
        return redact_text(line, find_spans(line))
    redacted = redact_document(value)
    return line if _dump(redacted) == _dump(value) else _dump(redacted)


def redact_skipped(entry: dict) -> dict:
    """A skipped line's entry with placeholders in its text and in its problems' messages (which may quote it)."""
    return entry | {"text": redact_line(entry.get("text", "")), "problems": redact_document(entry.get("problems", []))}


def skipped_as_kept(skipped: list[dict], sensitive_data: str) -> list[dict]:
    """Lines --skip-invalid left out (conversations or pairs), as the token cache and OUT/skipped.jsonl keep them:
    with placeholders where they held sensitive values (redact), as every copy of the data."""
    return [redact_skipped(entry) for entry in skipped] if sensitive_data == "redact" else skipped
