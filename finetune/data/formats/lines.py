"""What every format's line checker shares: the problem codes, the line being checked, safe quoting.

The codes are stable (scripts rely on them) and each is documented, with its fix, in docs/formats.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from finetune.data.types import Conversation, Problem

# Errors: the line (or the file) cannot be used as it is.
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
NON_TEXT_CONTENT = "non_text_content"
INVALID_UNICODE = "invalid_unicode"
BAD_WEIGHT = "bad_weight"
BAD_ROLE_ORDER = "bad_role_order"
NO_TARGET = "no_target"
EMPTY_ASSISTANT = "empty_assistant"
BAD_TOOLS = "bad_tools"
BAD_TOOL_CALL = "bad_tool_call"
ARGUMENTS_NOT_JSON = "arguments_not_json"
UNKNOWN_FUNCTION = "unknown_function"
DUPLICATE_TOOL_CALL_ID = "duplicate_tool_call_id"
TOOL_WITHOUT_CALL = "tool_without_call"
UNKNOWN_TOOL_CALL_ID = "unknown_tool_call_id"
BAD_HISTORY = "bad_history"
LINE_TOO_LONG = "line_too_long"
DUPLICATE_KEY = "duplicate_key"
# Warnings: the line is usable, but look.
BLANK_LINE = "blank_line"
EMPTY_CONTENT = "empty_content"
DUPLICATE = "duplicate"


@dataclass
class Line:
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


# Words spelt with a vowel but said with a consonant ("a user", "a unicode string").
_SAID_WITH_A_CONSONANT = ("user", "uni", "use", "usu", "one")


def with_article(word: str) -> str:
    """The word with its article: "an array", "an assistant", "a string", "a user" ("null" takes none)."""
    if word == "null":
        return word
    vowel = word[:1] in "aeiou" and not word.startswith(_SAID_WITH_A_CONSONANT)
    return f"{'an' if vowel else 'a'} {word}"


def json_type(value: object) -> str:
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


def is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def quote(value: object, limit: int = 40) -> str:
    """A user's value, safe to print (JSON-quoted, no unpaired surrogates) and short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if not is_encodable(text):
        text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_unknown_keys(obj: dict, allowed: tuple[str, ...], where: str, line: Line) -> None:
    for key in obj:
        if key not in allowed:
            names = ", ".join(f'"{k}"' for k in allowed)
            line.error(UNKNOWN_KEY, f"{where}unknown key {quote(key)}; allowed keys: {names}")


def check_string(value: object, name: str, line: Line, required: bool = True) -> str | None:
    """A string field (a prompt, a ShareGPT value, an Alpaca instruction). Empty is allowed, with a warning."""
    if value is None:
        if required:
            line.error(MISSING_CONTENT, f"{name} is missing or null; it must be a string")
        return None
    if not isinstance(value, str):
        line.error(CONTENT_NOT_STRING, f"{name} is {with_article(json_type(value))}, not a string")
        return None
    if not is_encodable(value):
        line.error(INVALID_UNICODE, f"{name} holds an invalid \\u escape (an unpaired surrogate)")
        return None
    if required and not value.strip():
        line.warn(EMPTY_CONTENT, f"{name} is empty")
    return value
