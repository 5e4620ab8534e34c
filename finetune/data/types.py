"""The data types that flow through the data path: Conversation -> Record -> TokenizedRecord.

Nothing here imports torch: the plan and the validator use these types on machines without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum

ROLES = ("system", "developer", "user", "assistant", "tool")
IGNORE_INDEX = -100  # label value for tokens that are read but never scored


class RecordPolicy(StrEnum):
    """How a conversation becomes training records."""

    ALL = "all"  # one record; every assistant message with weight > 0 is a target
    LAST = "last"  # one record; only the final assistant message is a target
    EACH = "each"  # one record per target turn, ending at that turn


class Truncation(StrEnum):
    """What happens to a record longer than the max sequence length."""

    LEFT = "left"  # drop context tokens from the left; drop the record if a target would be cut
    DROP = "drop"  # drop the whole record


@dataclass(frozen=True)
class ToolCall:
    """One function call made by an assistant message (OpenAI `tool_calls[i]`)."""

    id: str
    name: str
    arguments: str  # a JSON string, exactly as the data holds it

    def to_dict(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    weight: float = 1.0  # only meaningful on assistant messages: 0 = context, (0, 1] = scaled target
    name: str | None = None  # OpenAI `name`: who is speaking, or which function a tool result comes from
    tool_calls: tuple[ToolCall, ...] = ()  # assistant messages: the calls it makes (learned with its content)
    tool_call_id: str | None = None  # tool messages: the call this result answers


@dataclass(frozen=True)
class Conversation:
    """One validated line of the user's file."""

    messages: tuple[Message, ...]
    line: int  # 1-based line number in its file
    source: str = ""  # file path, for messages
    tools: tuple[dict, ...] = ()  # OpenAI `tools`: function schemas the model is shown (context, never scored)
    parallel_tool_calls: bool | None = None  # OpenAI `parallel_tool_calls`, kept for `finetune convert`

    def key(self) -> tuple:
        """Identity for duplicate detection: exact same messages (roles, contents, weights, calls) and tools."""
        messages = tuple((m.role, m.content, m.weight, m.name, m.tool_calls, m.tool_call_id) for m in self.messages)
        return messages + ((json.dumps(self.tools, sort_keys=True),) if self.tools else ())


@dataclass(frozen=True)
class Record:
    """A conversation prefix with the assistant messages chosen as targets."""

    messages: tuple[Message, ...]
    targets: tuple[int, ...]  # indices into messages of the scored assistant messages
    conversation: int  # index of the source conversation in its file (0-based)
    line: int
    tools: tuple[dict, ...] = ()  # the conversation's tool schemas, rendered as context


@dataclass
class TokenizedRecord:
    """Token ids with per-token loss weights; weight 0 and label -100 on every context token.

    `labels[i]` is the token the model must predict *at* position i, i.e. the label is aligned with
    input_ids (not shifted); shifting happens once, in the loss.
    """

    input_ids: list[int]
    labels: list[int]
    weights: list[float]
    conversation: int
    line: int
    truncated_tokens: int = 0  # context tokens dropped from the left

    @property
    def num_targets(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Problem:
    """One problem found in a file: an error makes the file unusable, a warning does not."""

    line: int | None  # 1-based; None for problems of the whole file
    code: str  # stable, machine-readable, e.g. "not_json"
    message: str  # a sentence a person understands

    def to_dict(self) -> dict:
        return {"line": self.line, "code": self.code, "message": self.message}


@dataclass
class ParsedFile:
    """The result of reading and validating one file."""

    path: str
    format: str | None  # "chat" | "prompt_completion" | "sharegpt" | "alpaca" | None when undetectable
    conversations: list[Conversation] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors
