"""Preference pairs: read, validate, split and tokenize files of (prompt, chosen answer, rejected answer).

Two shapes, one pair per line (a file uses one of them):

    OpenAI:  {"input": {"messages": [...], "tools": [...]},
              "preferred_output": [{"role": "assistant", "content": "..."}],
              "non_preferred_output": [{"role": "assistant", "content": "..."}]}
    TRL / LLaMA-Factory:  {"prompt": "..." | [messages], "chosen": "..." | [message], "rejected": "..." | [message]}

A text prompt is one user message; a text answer is one assistant message. Each side of a pair becomes a
record `prompt + answer` with the answer as its only target, tokenized by the same chat-template render and
masking as supervised records (ChatTokenizer), so a pair's log-probabilities are read over exactly the
tokens supervised tuning would score. The split holds out whole prompts: every pair of one prompt lands on
the same side. Problem codes are stable (docs/formats.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from finetune.data.formats.conversation import finish_conversation
from finetune.data.formats.lines import Line, json_type
from finetune.data.formats.openai import check_message, check_tools
from finetune.data.read import json_error_at, problems_text
from finetune.data.skipped import skipped_lines
from finetune.data.types import Conversation, Message, Problem, Record, TokenizedRecord
from finetune.settings.errors import UserError
from finetune.settings.wording import ref

OPENAI = "openai_preference"
PROMPT_CHOSEN_REJECTED = "prompt_chosen_rejected"
FORMAT_NAMES = {
    OPENAI: "preference (OpenAI input/preferred_output)",
    PROMPT_CHOSEN_REJECTED: "preference (prompt/chosen/rejected)",
}
_SHAPES = {
    OPENAI: ("input", "preferred_output", "non_preferred_output"),
    PROMPT_CHOSEN_REJECTED: ("prompt", "chosen", "rejected"),
}

# ---- problem codes (stable; docs/formats.md)
EMPTY_FILE = "empty_file"
NOT_JSON = "not_json"
NOT_OBJECT = "not_object"
UNKNOWN_SHAPE = "not_a_preference_pair"
MIXED_FORMATS = "mixed_formats"
MISSING_KEY = "missing_key"
UNKNOWN_KEY = "unknown_key"
BAD_MESSAGE = "bad_message"
BAD_TOOLS = "tools_not_list"
EMPTY_PROMPT = "empty_prompt"
PROMPT_NOT_OPEN = "prompt_does_not_end_for_a_reply"
EMPTY_OUTPUT = "empty_output"
MULTIPLE_OUTPUT_MESSAGES = "more_than_one_output_message"
OUTPUT_NOT_ASSISTANT = "output_not_assistant"
IDENTICAL_OUTPUTS = "identical_chosen_and_rejected"
DUPLICATE_PAIR = "duplicate_pair"  # a warning
REPLY_FOLLOWS = ("user", "tool")  # the roles an assistant reply answers


@dataclass(frozen=True)
class PreferencePair:
    """One validated line: the prompt messages and the two answers to it."""

    prompt: tuple[Message, ...]
    chosen: Message  # one assistant message: text, and any tool calls it makes
    rejected: Message
    line: int
    tools: tuple[dict, ...] = ()  # OpenAI `input.tools`: rendered into the prompt as context, never scored

    def prompt_conversation(self) -> Conversation:
        """The prompt as a Conversation: its key groups the pairs of one prompt (split, duplicates)."""
        return Conversation(self.prompt, self.line, tools=self.tools)

    def record(self, answer: Message, index: int) -> Record:
        return Record((*self.prompt, answer), (len(self.prompt),), index, self.line, self.tools)


@dataclass
class TokenizedPair:
    """The chosen and the rejected record of one prompt: the example a preference step trains on."""

    chosen: TokenizedRecord
    rejected: TokenizedRecord
    line: int
    reference: tuple[float, float] | None = None
    """Log-probabilities of (chosen, rejected) under the starting model, when computed once before training."""

    def __len__(self) -> int:
        return len(self.chosen) + len(self.rejected)


@dataclass
class PreferenceFile:
    path: str
    format: str | None
    pairs: list[PreferencePair] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


# ----------------------------------------------------------------------------- reading


def shape_of(value: object) -> str | None:
    """Which preference shape a parsed line has, by its answer keys; None when it is not a pair."""
    if not isinstance(value, dict):
        return None
    if "preferred_output" in value or "non_preferred_output" in value:
        return OPENAI
    if "chosen" in value or "rejected" in value:
        return PROMPT_CHOSEN_REJECTED
    return None


def is_preference_file(path: str | Path) -> bool:
    """True when the first JSON object line of the file is a preference pair (either shape)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for text in f:
                if text.strip():
                    try:
                        return shape_of(json.loads(text.lstrip("\ufeff"))) is not None
                    except (ValueError, RecursionError):  # not JSON: the validator names the problem
                        return False
    except OSError:
        return False
    return False


class _LineProblems(list):
    def __init__(self, number: int) -> None:
        super().__init__()
        self.number = number

    def add(self, code: str, message: str) -> None:
        self.append(Problem(self.number, code, message))


def _messages(value: object, what: str, problems: _LineProblems) -> list[Message] | None:
    """A list of OpenAI chat messages, read by the supervised reader (text parts, `name`, tool calls and results)."""
    if not isinstance(value, list):
        problems.add(BAD_MESSAGE, f"{what} must be a list of messages or a text, got {json_type(value)}")
        return None
    line = Line(problems.number)
    messages = [check_message(i, item, line) for i, item in enumerate(value, 1)]
    for problem in line.errors:  # one stable code for a malformed message; the text says what is wrong
        problems.add(BAD_MESSAGE, f"{what}: {problem.message}")
    if line.errors or any(m is None for m in messages):
        return None
    return messages


def _prompt(value: object, problems: _LineProblems) -> tuple[Message, ...] | None:
    messages = [Message("user", value)] if isinstance(value, str) else _messages(value, "the prompt", problems)
    if messages is None:
        return None
    if not messages or not any(m.content.strip() or m.tool_calls for m in messages):
        problems.add(EMPTY_PROMPT, "the prompt is empty: there is nothing for the answers to reply to")
        return None
    if messages[-1].role not in REPLY_FOLLOWS:
        problems.add(
            PROMPT_NOT_OPEN,
            f"the prompt ends with a message of role {messages[-1].role}, so it does not end where a reply should "
            "start: end it with a user message (or a tool result); the answers are the reply to it",
        )
        return None
    return tuple(messages)


def _answer(value: object, key: str, problems: _LineProblems) -> Message | None:
    if isinstance(value, str):
        message = Message("assistant", value)
    else:
        messages = _messages(value, key, problems)
        if messages is None:
            return None
        if len(messages) > 1:
            problems.add(
                MULTIPLE_OUTPUT_MESSAGES,
                f"{key} has {len(messages)} messages; an answer is exactly one assistant message",
            )
            return None
        if not messages:
            problems.add(EMPTY_OUTPUT, f"{key} has no message")
            return None
        message = messages[0]
        if message.role != "assistant":
            problems.add(
                OUTPUT_NOT_ASSISTANT,
                f"{key} is a message of role {message.role}; an answer is an assistant message",
            )
            return None
        if message.weight != 1:
            problems.add(BAD_MESSAGE, f'{key} has "weight" {message.weight:g}: an answer is always scored whole')
            return None
    if not message.content.strip() and not message.tool_calls:
        problems.add(EMPTY_OUTPUT, f"{key} is empty: there is no answer to score")
        return None
    return message


def _checked(prompt: tuple[Message, ...], answer: Message, tools: tuple, problems: _LineProblems) -> tuple | None:
    """Prompt + answer judged as one supervised conversation (role order, tool results linked to their calls,
    known functions); (prompt, answer) with the missing tool-call ids filled in, None when it has an error."""
    line = Line(problems.number)
    conversation = finish_conversation([*prompt, answer], tools, None, line)
    problems.extend(p for p in line.errors if p not in problems)  # a prompt's problem is found with either answer
    return None if conversation is None else (conversation.messages[:-1], conversation.messages[-1])


def _pair(value: dict, shape: str, number: int, problems: _LineProblems) -> PreferencePair | None:
    prompt_key, chosen_key, rejected_key = _SHAPES[shape]
    missing = [k for k in _SHAPES[shape] if k not in value]
    if missing:
        problems.add(MISSING_KEY, f"missing {', '.join(missing)} (this file's pairs have {', '.join(_SHAPES[shape])})")
        return None
    unknown = sorted(set(value) - set(_SHAPES[shape]) - {"id", "metadata"})
    if unknown:
        problems.add(UNKNOWN_KEY, f"unknown key(s) {', '.join(unknown)}; a pair has {', '.join(_SHAPES[shape])}")
    tools: tuple = ()
    prompt_value = value[prompt_key]
    if shape == OPENAI:
        if not isinstance(prompt_value, dict) or "messages" not in prompt_value:
            problems.add(MISSING_KEY, 'input must be an object with "messages" (and optionally "tools")')
            return None
        line = Line(number)
        schemas = check_tools(prompt_value.get("tools"), prompt_value.get("functions"), line)
        if schemas is None:
            problems.extend(Problem(number, BAD_TOOLS, f"input: {p.message}") for p in line.errors)
            return None
        tools = schemas
        prompt_value = prompt_value["messages"]
    prompt = _prompt(prompt_value, problems)
    chosen = _answer(value[chosen_key], chosen_key, problems)
    rejected = _answer(value[rejected_key], rejected_key, problems)
    if prompt is None or chosen is None or rejected is None:
        return None
    with_chosen = _checked(prompt, chosen, tools, problems)
    with_rejected = _checked(prompt, rejected, tools, problems)
    if with_chosen is None or with_rejected is None:
        return None
    (prompt, chosen), rejected = with_chosen, with_rejected[1]
    if chosen == rejected:
        problems.add(
            IDENTICAL_OUTPUTS, f"{chosen_key} and {rejected_key} are the same answer: there is nothing to prefer"
        )
        return None
    return PreferencePair(prompt, chosen, rejected, number, tools)


def read_preferences(path: str | Path) -> PreferenceFile:
    """Read and validate a preference file; every problem is collected, none raised."""
    result = PreferenceFile(str(path), None)
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    seen: dict[tuple, int] = {}
    for number, line in enumerate(text.lstrip("\ufeff").splitlines(), 1):
        if not line.strip():
            continue
        problems = _LineProblems(number)
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.add(NOT_JSON, f"not valid JSON ({json_error_at(exc)})")
            value = None
        shape = shape_of(value)
        if value is not None and not isinstance(value, dict):
            problems.add(NOT_OBJECT, "a line must be a JSON object")
        elif value is not None and shape is None:
            problems.add(
                UNKNOWN_SHAPE,
                "not a preference pair: expected preferred_output/non_preferred_output or chosen/rejected",
            )
        elif shape is not None:
            result.format = result.format or shape
            if shape != result.format:
                problems.add(
                    MIXED_FORMATS,
                    f"this line is {FORMAT_NAMES[shape]} but the file started as {FORMAT_NAMES[result.format]}",
                )
            else:
                pair = _pair(value, shape, number, problems)
                if pair is not None:
                    key = (pair.prompt_conversation().key(), pair.chosen, pair.rejected)
                    if key in seen:
                        result.warnings.append(Problem(number, DUPLICATE_PAIR, f"the same pair as line {seen[key]}"))
                    seen.setdefault(key, number)
                    result.pairs.append(pair)
        result.errors += [p for p in problems if p.code != UNKNOWN_KEY]
        result.warnings += [p for p in problems if p.code == UNKNOWN_KEY]
    if not result.pairs and not result.errors:
        result.errors.append(Problem(None, EMPTY_FILE, "the file holds no preference pairs"))
    return result


def load_pairs(path: str, skip_invalid: bool = False) -> tuple[list[PreferencePair], list[dict]]:
    """The usable pairs and, with --skip-invalid, the lines left out (for OUT/skipped.jsonl); UserError otherwise."""
    parsed = read_preferences(path)
    if parsed.ok:
        return parsed.pairs, []
    if parsed.format is None and parsed.errors and all(p.code == UNKNOWN_SHAPE for p in parsed.errors):
        raise UserError(
            f"{path} holds no preference pairs (no line has preferred_output/non_preferred_output or "
            f"chosen/rejected): {ref('method', 'dpo')} trains on pairs of answers (docs/formats.md); train on "
            f"conversations without {ref('method', 'dpo')}"
        )
    problems = problems_text(parsed)  # the same report as a chat file's (path and errors)
    if not skip_invalid:
        raise UserError(f"{problems}\nOr pass {ref('skip_invalid')} to train on the valid pairs only.")
    if any(p.line is None for p in parsed.errors):
        raise UserError(f"{problems}\n{ref('skip_invalid')} skips lines; it cannot skip a problem of the whole file.")
    if not parsed.pairs:
        raise UserError(
            f"{problems}\n{ref('skip_invalid')}: no line of the file is a valid pair, so there is nothing to train on."
        )
    return parsed.pairs, skipped_lines(parsed)
