"""Read the user's data file and report every problem in it, with its line number and a stable code.

    parsed = read_file("train.jsonl")
    parsed.format                   # "chat" | "prompt_completion" | None
    parsed.conversations            # the lines that are usable, as Conversations
    parsed.errors, parsed.warnings  # Problem(line, code, message), in file order
    parsed.ok                       # no errors

The bytes are never trusted: whatever the file holds, `read_file` returns a ParsedFile (only a
missing or unreadable file raises UserError). The codes are documented in docs/formats.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from finetune.data.types import ROLES, Conversation, Message, ParsedFile, Problem
from finetune.errors import UserError

CHAT = "chat"
PROMPT_COMPLETION = "prompt_completion"
FORMAT_NAMES = {CHAT: "chat (messages)", PROMPT_COMPLETION: "prompt/completion"}

CHAT_KEYS = ("messages",)
MESSAGE_KEYS = ("role", "content", "weight")
PROMPT_COMPLETION_KEYS = ("prompt", "completion")

ORDER_RULE = "an optional system message first, then user and assistant in turn"

UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")

# Errors: the file cannot be used as it is.
EMPTY_FILE = "empty_file"
NOT_UTF8 = "not_utf8"
BOM = "bom"
NOT_JSON = "not_json"
NOT_OBJECT = "not_object"
MIXED_FORMATS = "mixed_formats"
MISSING_MESSAGES = "missing_messages"
MESSAGES_NOT_LIST = "messages_not_list"
EMPTY_MESSAGES = "empty_messages"
UNKNOWN_KEY = "unknown_key"
MESSAGE_NOT_OBJECT = "message_not_object"
MISSING_ROLE = "missing_role"
UNKNOWN_ROLE = "unknown_role"
MISSING_CONTENT = "missing_content"
CONTENT_NOT_STRING = "content_not_string"
INVALID_UNICODE = "invalid_unicode"
BAD_WEIGHT = "bad_weight"
BAD_ROLE_ORDER = "bad_role_order"
NO_TARGET = "no_target"
# Warnings: the file is usable, but look.
BLANK_LINE = "blank_line"
EMPTY_CONTENT = "empty_content"
DUPLICATE = "duplicate"


@dataclass
class _Line:
    """One line on its way from bytes to a Conversation, with the problems found on the way."""

    number: int
    value: object = None  # the parsed JSON object; None when the line is blank or not a JSON object
    conversation: Conversation | None = None  # set when the line has no error
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    def error(self, code: str, message: str) -> None:
        self.errors.append(Problem(self.number, code, message))

    def warn(self, code: str, message: str) -> None:
        self.warnings.append(Problem(self.number, code, message))


# ----------------------------------------------------------------------------- the file


def read_file(path: str | Path) -> ParsedFile:
    """Read, decode, parse and validate every line of `path`; never raises for what the bytes hold."""
    data = _read_bytes(Path(path))
    return parse_bytes(data, str(path))


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, not a data file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def parse_bytes(data: bytes, path: str = "") -> ParsedFile:
    """Validate the content of a data file held in memory (`path` only names it in messages)."""
    parsed = ParsedFile(path=path, format=None)
    if data.startswith(UTF16_BOMS):
        parsed.errors.append(
            Problem(1, BOM, "the file is UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8")
        )
        return parsed
    if data.startswith(UTF8_BOM):
        parsed.errors.append(
            Problem(1, BOM, "the file starts with a byte-order mark (BOM); save it as UTF-8 without BOM")
        )
        data = data[len(UTF8_BOM) :]

    raw_lines = _split_lines(data)
    if all(not raw.strip() for raw in raw_lines):
        parsed.errors.insert(0, Problem(None, EMPTY_FILE, "the file is empty: it holds no examples"))  # file-wide first
        return parsed

    lines = [_decode_line(number, raw) for number, raw in enumerate(raw_lines, start=1)]
    parsed.format = _detect_format(line.value for line in lines)
    for line in lines:
        _check_line(line, parsed.format, path)
    _warn_duplicates(lines)

    for line in lines:
        parsed.errors.extend(line.errors)
        parsed.warnings.extend(line.warnings)
        if line.conversation is not None and not line.errors:
            parsed.conversations.append(line.conversation)
    return parsed


def _split_lines(data: bytes) -> list[bytes]:
    """Lines as the user's editor numbers them: '\\n' ends a line, a '\\r' before it is dropped."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line does not start a new one
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


# ----------------------------------------------------------------------------- one line: bytes -> JSON value


def _decode_line(number: int, raw: bytes) -> _Line:
    line = _Line(number)
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
        value = json.loads(text)
    except RecursionError:
        line.error(NOT_JSON, "not JSON: nested too deeply")
        return line
    except ValueError as exc:  # JSONDecodeError, and too-long integers
        line.error(NOT_JSON, f"not JSON: {_json_reason(exc)}; each line must be one JSON object")
        return line
    if not isinstance(value, dict):
        line.error(NOT_OBJECT, f"the line is a JSON {_json_type(value)}, not an object {{...}}")
        return line
    line.value = value
    return line


def _json_reason(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    return str(exc)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _line_format(obj: object) -> str | None:
    if not isinstance(obj, dict):
        return None
    if "messages" in obj:
        return CHAT
    if "prompt" in obj or "completion" in obj:
        return PROMPT_COMPLETION
    return None


def _detect_format(values) -> str | None:
    """The file's format is the format of its first recognisable line; other lines must follow it."""
    for value in values:
        kind = _line_format(value)
        if kind is not None:
            return kind
    return None


# ----------------------------------------------------------------------------- one line: JSON object -> Conversation


def _check_line(line: _Line, file_format: str | None, path: str) -> None:
    obj = line.value
    if not isinstance(obj, dict):
        return
    kind = _line_format(obj)
    if kind is not None and kind != file_format:
        line.error(
            MIXED_FORMATS,
            f"this line is {FORMAT_NAMES[kind]} but the file is {FORMAT_NAMES[file_format]}; use one format per file",
        )
        return
    check = _check_prompt_completion if file_format == PROMPT_COMPLETION else _check_chat
    messages = check(obj, line)
    if messages is not None and not line.errors:
        line.conversation = Conversation(messages=tuple(messages), line=line.number)


def _check_unknown_keys(obj: dict, allowed: tuple[str, ...], where: str, line: _Line) -> None:
    for key in obj:
        if key not in allowed:
            names = ", ".join(f'"{k}"' for k in allowed)
            line.error(UNKNOWN_KEY, f"{where}unknown key {_quote(key)}; allowed keys: {names}")


def _check_prompt_completion(obj: dict, line: _Line) -> list[Message] | None:
    _check_unknown_keys(obj, PROMPT_COMPLETION_KEYS, "", line)
    texts = [_check_text(obj, key, f'"{key}"', line) for key in PROMPT_COMPLETION_KEYS]
    if any(text is None for text in texts):
        return None
    prompt, completion = texts
    return [Message("user", prompt), Message("assistant", completion)]


def _check_chat(obj: dict, line: _Line) -> list[Message] | None:
    _check_unknown_keys(obj, CHAT_KEYS, "", line)
    raw = obj.get("messages")
    if raw is None:
        line.error(
            MISSING_MESSAGES, 'no "messages": each line must be {"messages": [{"role": ..., "content": ...}, ...]}'
        )
        return None
    if not isinstance(raw, list):
        line.error(MESSAGES_NOT_LIST, f'"messages" is a {_json_type(raw)}; it must be a list of messages')
        return None
    if not raw:
        line.error(EMPTY_MESSAGES, '"messages" is an empty list: there is nothing to learn from')
        return None
    messages = [_check_message(i, item, line) for i, item in enumerate(raw, start=1)]
    if any(m is None for m in messages):
        return None  # role order and targets are only judged on well-formed messages
    if _check_targets(messages, line):
        _check_role_order(messages, line)
    return messages


def _check_message(index: int, item: object, line: _Line) -> Message | None:
    where = f"message {index}: "
    if not isinstance(item, dict):
        line.error(MESSAGE_NOT_OBJECT, f'{where}is a {_json_type(item)}; a message is {{"role": ..., "content": ...}}')
        return None
    _check_unknown_keys(item, MESSAGE_KEYS, where, line)
    role = _check_role(item, where, line)
    content = _check_text(item, "content", f'{where}"content"', line)
    weight = _check_weight(item, role, where, line)
    if role is None or content is None or weight is None:
        return None
    return Message(role, content, weight)


def _check_role(item: dict, where: str, line: _Line) -> str | None:
    if "role" not in item:
        line.error(MISSING_ROLE, f'{where}no "role"; use one of {", ".join(ROLES)}')
        return None
    role = item["role"]
    if role not in ROLES:
        line.error(UNKNOWN_ROLE, f"{where}unknown role {_quote(role)}; use one of {', '.join(ROLES)}")
        return None
    return role


def _check_text(obj: dict, key: str, name: str, line: _Line) -> str | None:
    """A required string field (message content, prompt, completion). Empty is allowed, with a warning."""
    value = obj.get(key)
    if value is None:
        line.error(MISSING_CONTENT, f"{name} is missing" if key not in obj else f"{name} is null; it must be a string")
        return None
    if not isinstance(value, str):
        hint = " (content parts are not supported: join them into one string)" if isinstance(value, list) else ""
        line.error(CONTENT_NOT_STRING, f"{name} is a {_json_type(value)}, not a string{hint}")
        return None
    if not _is_encodable(value):
        line.error(INVALID_UNICODE, f"{name} holds an invalid \\u escape (an unpaired surrogate)")
        return None
    if not value.strip():
        line.warn(EMPTY_CONTENT, f"{name} is empty")
    return value


def _check_weight(item: dict, role: str | None, where: str, line: _Line) -> float | None:
    if "weight" not in item:
        return 1.0
    weight = item["weight"]
    if role is not None and role != "assistant":
        line.error(BAD_WEIGHT, f'{where}"weight" is only allowed on assistant messages, not on {role}')
        return None
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        line.error(BAD_WEIGHT, f'{where}"weight" is {_quote(weight)}; it must be a number from 0 to 1')
        return None
    if not 0 <= weight <= 1:
        line.error(BAD_WEIGHT, f'{where}"weight" is {weight}; it must be from 0 (context only) to 1 (fully learned)')
        return None
    return float(weight)


def _check_targets(messages: list[Message], line: _Line) -> bool:
    """At least one assistant message must be learned; False when there is no assistant message at all."""
    assistants = [m for m in messages if m.role == "assistant"]
    if not assistants:
        line.error(NO_TARGET, "no assistant message: nothing to learn from this conversation")
        return False
    if all(m.weight == 0 for m in assistants):
        line.error(NO_TARGET, 'every assistant message has "weight": 0: nothing to learn from this conversation')
    return True


def _check_role_order(messages: list[Message], line: _Line) -> None:
    """An optional system message first, then user and assistant in turn, starting with user, ending with assistant."""
    start = 1 if messages[0].role == "system" else 0
    for i, message in enumerate(messages[start:], start=start):
        expected = "user" if (i - start) % 2 == 0 else "assistant"
        if message.role != expected:
            after = f"after a {messages[i - 1].role} message" if i else "at the start"
            line.error(BAD_ROLE_ORDER, f"message {i + 1} is {message.role} {after}; expected {expected} ({ORDER_RULE})")
            return
    if messages[-1].role != "assistant":
        line.error(
            BAD_ROLE_ORDER, f"the conversation ends with a {messages[-1].role} message; it must end with assistant"
        )


def _warn_duplicates(lines: list[_Line]) -> None:
    first_seen: dict[tuple, int] = {}
    for line in lines:
        if line.conversation is None or line.errors:
            continue
        key = line.conversation.key()
        if key in first_seen:
            line.warn(DUPLICATE, f"the same conversation as line {first_seen[key]}")
        else:
            first_seen[key] = line.number


# ----------------------------------------------------------------------------- helpers


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _quote(value: object, limit: int = 40) -> str:
    """A user's value, safe to print (JSON-quoted, no unpaired surrogates) and short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if not _is_encodable(text):
        text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"
