"""The data types that flow through the data path: Conversation -> Record -> TokenizedRecord,
and DataSummary, the numbers of the prepared data the plan is built from.

Nothing here imports torch: the plan and the validator use these types on machines without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

ROLES = ("system", "developer", "user", "assistant", "tool")
IGNORE_INDEX = -100  # label value for tokens that are read but never scored


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
    tools: tuple[dict, ...] = ()  # OpenAI `tools`: function schemas the model is shown (context, never scored)
    parallel_tool_calls: bool | None = None  # OpenAI `parallel_tool_calls`, kept for `finetune convert`

    def key(self) -> tuple:
        """Identity for duplicate detection: exact same messages (roles, contents, weights, calls) and tools."""
        messages = tuple(
            (
                m.role,
                m.content,
                m.weight,
                m.name,
                tuple((c.id, c.name, c.arguments) for c in m.tool_calls),
                m.tool_call_id,
            )
            for m in self.messages
        )  # plain values only: split.py and the token cache hash its JSON
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


@dataclass(frozen=True)
class DataSummary:
    """The data's numbers: from a prepared file (data/prepare.py) or a what-if question (plan/plan.py).

    The one summary of the data: the plan holds it (`plan.data`) and its fields are keys of plan.json
    as they are named here. None means unknown (a what-if plan, or counted without a tokenizer).
    """

    examples: int
    """Training records (examples): what steps are counted in."""
    validation_examples: int | None
    """Validation records; None when unknown (a what-if plan with a validation file)."""
    conversations: int | None
    """Training conversations (lines of the file) the records come from; None when unknown."""
    validation_conversations: int | None
    """Validation conversations (held out whole); None when unknown."""
    messages: int | None
    """Messages in the training conversations, all roles; None when unknown."""
    tokens_in_file: int | None
    """Tokens of all training records after truncation: what one epoch reads; None when unknown."""
    counted_with_tokenizer: bool = True
    """False when token numbers are estimated from the text (no --model) or guessed."""
    target_tokens: int | None = None
    """Scored tokens of the training records."""
    max_record_tokens: int | None = None
    """Longest training record (after fitting to max_seq_len): sizes the activation estimate."""
    p50_record_tokens: int | None = None
    p95_record_tokens: int | None = None
    truncated_records: int = 0
    """Training records shortened to fit max_seq_len: replies kept, earlier turns left out (or a long one cut)."""
    truncated_tokens: int = 0
    """Context tokens cut from the left inside a message, in those records."""
    dropped_records: int = 0
    """Records (training and validation) left out: a reply alone does not fit max_seq_len (or --truncation drop)."""
    dropped_lines: tuple[int, ...] = ()
    """File lines of the dropped records."""
    max_seq_len: int | None = None
    """The record length limit the data was fitted to (the plan's max_seq_len); None for a what-if plan."""
    max_seq_len_reason: str | None = None
    """Why that limit, when Auto chose it."""
    split_at: tuple[str, ...] = ()
    """FILE:LINE of each conversation longer than max_seq_len split into several records (docs/formats.md)."""
    split_records: int = 0
    """The records those conversations became (training and validation)."""
    shortened_at: tuple[str, ...] = ()
    """FILE:LINE of each record shortened to fit (training and validation)."""
    dropped_at: tuple[str, ...] = ()
    """FILE:LINE of each dropped record."""
    dropped_need_tokens: int = 0
    """The max_seq_len that would keep every dropped record."""
    duplicates_removed: int = 0
    """Validation conversations dropped as exact copies of training ones (no leak across sides)."""
    duplicate_conversations: int = 0
    """Training-file conversations that repeat an earlier one (kept: each is trained on once more per epoch)."""
    duplicate_lines: tuple[int, ...] = ()
    """File lines of the first of those copies (10 at most)."""
    skipped_lines: int = 0
    """Invalid lines of the data left out with --skip-invalid (each listed in OUT/skipped.jsonl)."""
    context_tokens: int | None = None
    """Tokens of the training records read but never scored (prompts, tool schemas and results): billed, not learned."""
    data_format: str | None = None
    """The training file's format ("chat", "sharegpt", "alpaca", "prompt_completion"): detected, or --format."""
    val_fraction: float | None = None
    """Share of conversations held out for validation (0 with a validation file or validation off)."""
    val_fraction_reason: str | None = None
    """Why that share (Auto's rule, the user's flag or file)."""
    what_if: bool = False
    """True for `finetune plan --examples N`: nothing was read from a file."""
    data_sha256: str | None = None
    """sha256 of the training file's bytes: a trainer executing this plan checks the file it reads against it."""
    val_sha256: str | None = None
    """sha256 of the validation file's bytes, with a validation file."""
    sensitive_found: dict | None = None
    """Sensitive values found in the data (data/sensitive.py: counts by kind and role, lines; never a value), and how
    many were replaced by placeholders (sensitive_data redact); None when not scanned."""
    invented_specifics: dict | None = None
    """Specifics (identifiers, amounts, dates, ...) the training file's trained replies state that their conversation
    never gave (data/invented.py: counts by kind, lines; never a value); None when not read."""
