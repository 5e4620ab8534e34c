"""Read the user's data file and report every problem in it, with its line number and a stable code.

    parsed = read_file("train.jsonl")          # also .jsonl.gz, a .json array, and .parquet (with pyarrow)
    parsed = read_file("data.jsonl", format="sharegpt")   # force a format instead of detecting it
    parsed.format                   # "chat" | "prompt_completion" | "sharegpt" | "alpaca" | None
    parsed.conversations            # the lines that are usable, as Conversations
    parsed.errors, parsed.warnings  # Problem(line, code, message), in file order
    parsed.ok                       # no errors

The bytes are never trusted: whatever the file holds, `read_file` returns a ParsedFile (only a
missing or unreadable file raises UserError). Each format's own checks live in finetune.data.formats;
the codes are documented in docs/formats.md.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from finetune.data.formats import CHECKERS, FORMAT_NAMES, FORMATS, line_format
from finetune.data.formats.lines import (
    BLANK_LINE,
    BOM,
    DUPLICATE,
    DUPLICATE_KEY,
    EMPTY_FILE,
    LINE_TOO_LONG,
    MISSING_MESSAGES,
    MIXED_FORMATS,
    NOT_JSON,
    NOT_OBJECT,
    NOT_UTF8,
    Line,
    json_type,
    quote,
)
from finetune.data.parquet import parquet_as_jsonl
from finetune.data.types import Conversation, ParsedFile, Problem
from finetune.settings.errors import UserError
from finetune.settings.wording import ref

UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
BOM_MESSAGE = "the file starts with a byte-order mark (BOM); save it as UTF-8 without BOM"
# One conversation of 4 MB is about a million tokens, far beyond any model's context; a longer line is refused
# before it is parsed or tokenized (a 50 MB line once took 10 GB and two minutes in the tokenizer).
MAX_LINE_BYTES = 4 * 1024 * 1024
GZIP_MAGIC = b"\x1f\x8b"
READ_BLOCK = 1 << 20  # what is inflated at a time: a gzip file's memory is its lines, never its ratio


# ----------------------------------------------------------------------------- the file


def read_file(path: str | Path, format: str | None = None) -> ParsedFile:
    """Read, decode, parse and validate every line of `path`; never raises for what the bytes hold.

    `format` forces one of FORMATS; by default (None or "auto") the file's first valid line decides.
    """
    data, cut_at = _load(Path(path))
    if cut_at is None:
        return parse_bytes(data, str(path), format)
    # a gzip file whose line `cut_at` passed the limit while decompressing: the lines before it are checked
    parsed = parse_bytes(data, str(path), format) if data.strip() else ParsedFile(path=str(path), format=None)
    parsed.errors.append(
        Problem(
            cut_at,
            LINE_TOO_LONG,
            f"once decompressed, the line passes the {MAX_LINE_BYTES // 2**20} MB a conversation may take, so "
            "reading stopped there (the rest of the file was not decompressed); split it into shorter conversations",
        )
    )
    return parsed


def load_bytes(path: str | Path) -> bytes:
    """The file as JSON Lines bytes: read as it is, gunzipped (.gz), or a Parquet table's rows as JSON lines.
    A gzip file is only decompressed up to a line longer than MAX_LINE_BYTES (read_file reports that line)."""
    return _load(Path(path))[0]


def _load(path: Path) -> tuple[bytes, int | None]:
    """(the JSON Lines bytes, the line a gzip file's reading stopped at because it passed the limit, or None)."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        _read_bytes(path, 0)  # a missing file or a folder is reported the same way as for JSONL
        return parquet_as_jsonl(path), None
    if not name.endswith(".gz"):
        return json_array_as_jsonl(_read_bytes(path)), None
    data = bytearray()
    try:
        with _open(path) as handle:
            for block in gunzip_bounded(handle):
                data += block
    except LineTooLong as exc:
        del data[exc.start :]
        return bytes(data), exc.line
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path}: not a readable gzip file ({exc}); decompress it or export it again") from None
    return json_array_as_jsonl(bytes(data)), None


class LineTooLong(Exception):
    """A line of a gzip stream passed the limit while it was being decompressed."""

    def __init__(self, line: int, start: int) -> None:
        super().__init__(f"line {line} is over {MAX_LINE_BYTES} bytes")
        self.line = line  # its number (1-based)
        self.start = start  # the offset of its first byte in the decompressed stream


def is_gzip(head: bytes) -> bool:
    """Whether bytes start like a gzip stream (its magic number), whatever the file is called."""
    return head.startswith(GZIP_MAGIC)


def gunzip_bounded(source: BinaryIO, max_line_bytes: int | None = None) -> Iterator[bytes]:
    """The decompressed bytes of a gzip stream, a block at a time (never more than one block is inflated at
    once, whatever the compression ratio). Raises LineTooLong as soon as the line being read passes
    `max_line_bytes` (default MAX_LINE_BYTES), after yielding the bytes before that line's start; a line that
    ends within a block may pass it by up to a block (the line check of parse_bytes names its size).
    OSError / EOFError / zlib.error for a damaged stream."""
    limit = max_line_bytes or MAX_LINE_BYTES
    line, line_bytes, offset = 1, 0, 0
    with gzip.GzipFile(fileobj=source, mode="rb") as stream:
        while block := stream.read(READ_BLOCK):
            breaks = block.count(b"\n")
            if breaks:
                line += breaks
                line_bytes = len(block) - block.rfind(b"\n") - 1
            else:
                line_bytes += len(block)
            if line_bytes > limit:
                start = offset + len(block) - line_bytes
                if start > offset:
                    yield block[: start - offset]
                raise LineTooLong(line, start)
            offset += len(block)
            yield block


def json_array_as_jsonl(data: bytes) -> bytes:
    """A file that is one JSON array of objects (a `.json` file as LLaMA-Factory and Stanford Alpaca ship them),
    as JSON Lines: item N is line N. Anything else (a damaged array, an array of non-objects) is returned as it
    is, to be read as JSON Lines."""
    bom = UTF8_BOM if data.startswith(UTF8_BOM) else b""
    first = _BYTE_SPACE.match(data, len(bom)).end()  # no copy of a file of gigabytes just to look at its start
    if not data.startswith(b"[", first):
        return data
    body = data[len(bom) :]
    try:
        items = _array_items(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return data  # not one valid array: read as JSON Lines, whose errors name the lines
    # JSON strings hold no raw line breaks, so the ones between tokens can go: each item fits on one line
    return bom + "".join(_LINE_BREAKS.sub(" ", item) + "\n" for item in items).encode("utf-8")


_BYTE_SPACE = re.compile(rb"[ \t\r\n]*")
_LINE_BREAKS = re.compile(r"[\r\n]+")
_SPACE = re.compile(r"[ \t\r\n]*")


def _array_items(text: str) -> list[str]:
    """The source text of each item of the JSON array `text` (ValueError unless it is exactly one array of
    objects)."""
    decoder = json.JSONDecoder()
    at = _SPACE.match(text).end() + 1  # after "["
    at = _SPACE.match(text, at).end()
    items: list[str] = []
    if text.startswith("]", at):
        at += 1
    else:
        while True:
            item, end = decoder.raw_decode(text, at)
            if not isinstance(item, dict):
                raise ValueError("an array of something else than examples")
            items.append(text[at:end])
            at = _SPACE.match(text, end).end()
            if text.startswith("]", at):
                at += 1
                break
            if not text.startswith(",", at):
                raise ValueError("not an array")
            at = _SPACE.match(text, at + 1).end()
    if text[at:].strip(" \t\r\n"):
        raise ValueError("more than one array")
    return items


def _read_bytes(path: Path, size: int = -1) -> bytes:
    with _open(path) as handle:
        try:
            return handle.read(size)
        except OSError as exc:
            raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None


@contextmanager
def _open(path: Path) -> Iterator[BinaryIO]:
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, not a data file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    with handle:
        yield handle


def parse_bytes(data: bytes, path: str = "", format: str | None = None) -> ParsedFile:
    """Validate the content of a data file held in memory (`path` only names it in messages)."""
    if format == "auto":
        format = None  # detect it
    if format is not None and format not in FORMATS:
        raise UserError(f"{ref('format')} must be one of {', '.join(FORMATS)}, got {format!r}")
    parsed = ParsedFile(path=path, format=None)
    if data.startswith(UTF16_BOMS):
        parsed.errors.append(
            Problem(1, BOM, "the file is UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8")
        )
        return parsed
    if data.startswith(UTF8_BOM):
        parsed.errors.append(Problem(1, BOM, BOM_MESSAGE))
        data = data[len(UTF8_BOM) :]

    raw_lines = split_lines(data)
    if all(not raw.strip() for raw in raw_lines):
        parsed.errors.insert(0, Problem(None, EMPTY_FILE, "the file is empty: it holds no examples"))  # file-wide first
        return parsed

    lines = [_decode_line(number, raw) for number, raw in enumerate(raw_lines, start=1)]
    detected_at = None
    if format is None:
        format, detected_at = _detect_format(lines)
    parsed.format = format
    for line in lines:
        _check_line(line, format, detected_at)
    _warn_duplicates(lines)

    for line in lines:
        parsed.errors.extend(line.errors)
        parsed.warnings.extend(line.warnings)
        if line.conversation is not None and not line.errors:
            parsed.conversations.append(line.conversation)
    return parsed


def split_lines(data: bytes) -> list[bytes]:
    """Lines as the user's editor numbers them: '\\n' ends a line, a '\\r' before it is dropped."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line does not start a new one
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


# ----------------------------------------------------------------------------- one line: bytes -> JSON value


def _decode_line(number: int, raw: bytes) -> Line:
    line = Line(number)
    if len(raw) > MAX_LINE_BYTES:
        line.error(
            LINE_TOO_LONG,
            f"the line is {len(raw) / 2**20:.1f} MB, over the {MAX_LINE_BYTES // 2**20} MB a conversation may take; "
            "split it into shorter conversations",
        )
        return line
    if not raw.strip():
        line.warn(BLANK_LINE, "blank line (ignored)")
        return line
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line.error(
            NOT_UTF8,
            f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line; save the file as UTF-8",
        )
        return line
    try:
        value = json.loads(text, object_pairs_hook=_object_without_duplicate_keys)
    except RecursionError:
        line.error(NOT_JSON, "not JSON: nested too deeply")
        return line
    except _DuplicateKey as exc:
        line.error(DUPLICATE_KEY, f"the key {quote(exc.key)} appears twice in one object; JSON keeps only the last")
        return line
    except ValueError as exc:  # JSONDecodeError, and too-long integers
        line.error(NOT_JSON, f"not JSON: {_json_reason(exc)}; each line must be one JSON object")
        return line
    if not isinstance(value, dict):
        line.error(NOT_OBJECT, f"the line is a JSON {json_type(value)}, not an object {{...}}")
        return line
    line.value = value
    return line


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object_without_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _json_reason(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return json_error_at(exc)
    return str(exc)


def json_error_at(exc: json.JSONDecodeError) -> str:
    """'Expecting value at column 12'; json's own words may end in "at" already ("Unterminated string starting
    at"), which read "at at column 47"."""
    return f"{exc.msg.removesuffix(' at')} at column {exc.colno}"


def _detect_format(lines: list[Line]) -> tuple[str | None, int | None]:
    """The file's format is that of its first valid line (and that line's number).

    A broken first line must not decide the format of a whole file of good lines; when no line is valid,
    the first line in a known format decides, so that its problems are reported in its own terms.
    """
    first_known: tuple[str | None, int | None] = (None, None)
    for line in lines:
        kind = line_format(line.value)
        if kind is None:
            continue
        if first_known[0] is None:
            first_known = (kind, line.number)
        trial = Line(line.number, line.value)
        CHECKERS[kind](line.value, trial)
        if not trial.errors:
            return kind, line.number
    return first_known


# ----------------------------------------------------------------------------- one line: JSON object -> Conversation


def _check_line(line: Line, file_format: str | None, detected_at: int | None) -> None:
    obj = line.value
    if not isinstance(obj, dict):
        return
    kind = line_format(obj)
    if detected_at is not None and kind is not None and kind != file_format:
        line.error(
            MIXED_FORMATS,
            f"line {line.number} is {FORMAT_NAMES[kind]}, but the file is {FORMAT_NAMES[file_format]} (from line "
            f"{detected_at}); use one format per file, or `finetune convert` each part to OpenAI chat first",
        )
        return
    if file_format is None:  # no line of the file is in a format we read: say which formats those are
        keys = ", ".join(quote(key, 20) for key in list(obj)[:5]) or "none"
        line.error(
            MISSING_MESSAGES,
            f"the line is in none of the formats finetune reads (its keys: {keys}): OpenAI chat "
            '{"messages": [...]}, ShareGPT {"conversations": [...]}, Alpaca {"instruction": ..., "output": ...} '
            'or {"prompt": ..., "completion": ...}; see docs/formats.md',
        )
        return
    line.conversation = CHECKERS[file_format](obj, line)


def _warn_duplicates(lines: list[Line]) -> None:
    usable = {line.number: line for line in lines if line.conversation is not None and not line.errors}
    for number, first in find_duplicates(line.conversation for line in usable.values()):
        usable[number].warn(DUPLICATE, f"the same conversation as line {first}")


def find_duplicates(conversations: Iterable[Conversation]) -> list[tuple[int, int]]:
    """(line, line of its first copy) of every conversation that repeats an earlier one, in file order."""
    first_seen: dict[tuple, int] = {}
    found = []
    for conversation in conversations:
        first = first_seen.setdefault(conversation.key(), conversation.line)
        if first != conversation.line:
            found.append((conversation.line, first))
    return found


DUPLICATE_LINES_SHOWN = 10


def duplicates_summary(count: int, lines: Sequence[int]) -> str:
    """One sentence for every copy at once (`validate` and the plan's warning): how many, and the first lines."""
    shown = ", ".join(str(n) for n in lines[:DUPLICATE_LINES_SHOWN]) + (" ..." if count > DUPLICATE_LINES_SHOWN else "")
    where = f"line {shown}" if count == 1 else f"first at lines {shown}"
    noun = "conversation" if count == 1 else "conversations"
    return (
        f"{count:,} duplicate {noun} ({where}): each the same as an earlier line, so it is trained on once more "
        "per epoch; remove the copies unless you mean to weight them"
    )


def problems_text(parsed: ParsedFile, limit: int = 10) -> str:
    """The errors of an unusable file (chat or preference pairs: anything with .path and .errors), for a UserError: the first `limit`, and how to see them all."""
    lines = [f"{parsed.path} is not usable ({len(parsed.errors)} error(s)):"]
    for problem in parsed.errors[:limit]:
        where = f"{parsed.path}:{problem.line}" if problem.line else parsed.path
        lines.append(f"  {where} [{problem.code}] {problem.message}")
    if len(parsed.errors) > limit:
        lines.append(f"  ... and {len(parsed.errors) - limit} more")
    lines.append(f"Run `finetune validate {parsed.path}` for the full report.")
    return "\n".join(lines)
