"""Records -> token ids and labels, with the model's own chat template.

We do not rely on `return_assistant_tokens_mask` (stock templates rarely carry `{% generation %}`
markers, so it often comes back all zeros). Instead the conversation is rendered to text once, the
content of every target reply is located in that text, and the text is tokenized piece by piece:

    [context ... ][target content][end-of-turn][context ...][target content][end-of-turn][tail]

so the target tokens of a message are exactly its content tokens plus the end-of-turn token that
closes it, whatever the template puts around them (role headers, `<think></think>` blocks, ...).

Tools are rendered the way the model sees them at inference: the schemas go to the template as
`tools=`, the calls as `tool_calls` (arguments as an object, the Hugging Face convention), the results
as `tool` messages. An assistant turn that makes calls is scored from the first character the
template writes for it (its content, or the call block when it has no content) to its end-of-turn:
that start is where the turn's rendering stops agreeing with the same turn rendered as plain text
(two probes with different first letters, so no shared character can hide it).

The data path calls `tokenize_arrays` (int32 ids and weights in numpy arrays, no list per token); its pieces
are encoded by SegmentEncoder, which encodes the text between added tokens once per process: the system
prompt that every conversation of an export repeats is looked up, not tokenized 100,000 times. `tokenize`
is the same, as a TokenizedRecord of lists.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from finetune.data.chat_template import use_chat_template
from finetune.data.formats.openai import parse_arguments
from finetune.data.segment_encoder import SegmentEncoder
from finetune.data.template_sandbox import TemplateLimitError, install
from finetune.data.types import IGNORE_INDEX, Message, Record, TokenizedRecord, ToolCall
from finetune.models.source import check_remote_code, load_failure, local_model
from finetune.settings.data_choices import Truncation
from finetune.settings.errors import RecordError, UserError

_SENTINEL = "FINETUNE-SENTINEL-7f3a"
_PROBES = ("A" + _SENTINEL, "Z" + _SENTINEL)  # differ in their first character
_PROBE_FUNCTION, _PROBE_ARGUMENT = "finetune_probe_function_7f3a", "finetune_probe_argument_7f3a"
_PROBE_RESULT, _PROBE_DESCRIPTION = "finetune probe result 7f3a", "finetune probe description 7f3a"


TOOL_FEATURES = {"calls": "tool calls", "results": "tool results", "schemas": "tool schemas (tools=)"}


def describe_tool_features(features: set[str]) -> str:
    return " or ".join(TOOL_FEATURES[f] for f in sorted(features))


class ToolTemplateError(UserError):
    """The model's chat template cannot render the tool calls, tool results or tool schemas the data holds."""


def template_message(message: Message, call_names: dict[str, str]) -> dict:
    """A Message as chat templates expect it (developer as system, call arguments as an object)."""
    item: dict = {"role": "system" if message.role == "developer" else message.role, "content": message.content}
    if message.name:
        item["name"] = message.name
    if message.tool_calls:
        item["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": parse_arguments(call.arguments) or {}},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool" and message.tool_call_id:
        item["tool_call_id"] = message.tool_call_id
        if not message.name and message.tool_call_id in call_names:
            item["name"] = call_names[message.tool_call_id]  # Llama 3 / Mistral style templates name the function
    return item


def tool_needs(messages, tools) -> set[str]:
    """What of the template's tool support a conversation uses: "calls", "results", "schemas"."""
    needs = {"schemas"} if tools else set()
    for message in messages:
        if message.tool_calls:
            needs.add("calls")
        if message.role == "tool":
            needs.add("results")
    return needs


@dataclass(frozen=True)
class TokenizeOutcome:
    record: TokenizedRecord | None  # None when the record was dropped
    dropped: str | None  # "too_long" | "target_would_be_cut" when dropped
    total_tokens: int  # tokens before truncation
    cut_tokens: int  # context tokens cut from the left (kept record) or that would have to be (dropped)


def load_tokenizer(model: str, trust_remote_code: bool = False, chat_template: str = "auto"):
    """The model's tokenizer with the chat template `chat_template` names (see `use_chat_template`), with a
    clear error instead of a traceback. A GGUF file or a pulled base's name loads from its converted folder."""
    from transformers import AutoTokenizer

    check_remote_code(model, trust_remote_code)
    install()  # every chat template this process renders is compiled with a budget of work and size
    try:
        tokenizer = AutoTokenizer.from_pretrained(local_model(model), trust_remote_code=trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # transformers raises many types here (OSError, ValueError, HF hub errors)
        raise load_failure(f"the tokenizer of {model!r}", exc) from None  # issue 26: names --trust-remote-code
    return use_chat_template(tokenizer, chat_template, model)


@dataclass(frozen=True)
class EncodedOutcome:
    """`TokenizeOutcome` as arrays: what the data path keeps (no Python list per token)."""

    input_ids: np.ndarray | None  # int32 [tokens] after truncation; None when the record was dropped
    weights: np.ndarray | None  # float64 [tokens] (the messages' weights exactly; 0 on context tokens)
    dropped: str | None
    total_tokens: int
    cut_tokens: int


class ChatTokenizer:
    """Tokenizes records with a tokenizer's chat template and marks exactly the target tokens."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn_text, self.end_of_turn_id = self._find_end_of_turn()
        self.closes_every_turn = self._closes_every_turn()

    def render(self, messages, tools=()) -> str:
        call_names = {call.id: call.name for m in messages for call in m.tool_calls}
        chat = [template_message(m, call_names) for m in messages]
        return self.tokenizer.apply_chat_template(
            chat, tools=list(tools) or None, tokenize=False, add_generation_prompt=False
        )

    @cached_property
    def tool_support(self) -> set[str]:
        """What of tools the template renders: "calls", "results", "schemas" (probed once with sentinels)."""
        call = ToolCall("call_probe", _PROBE_FUNCTION, json.dumps({_PROBE_ARGUMENT: 1}))
        conversation = [
            Message("user", "hi"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", _PROBE_RESULT, tool_call_id=call.id),
            Message("assistant", "ok"),
        ]
        schema = {
            "type": "function",
            "function": {
                "name": _PROBE_FUNCTION,
                "description": _PROBE_DESCRIPTION,
                "parameters": {"type": "object", "properties": {_PROBE_ARGUMENT: {"type": "integer"}}},
            },
        }
        supported = set()
        text = self._try_render(conversation)
        if _PROBE_FUNCTION in text and _PROBE_ARGUMENT in text:
            supported.add("calls")
        if _PROBE_RESULT in text:
            supported.add("results")
        if _PROBE_DESCRIPTION in self._try_render([Message("user", "hi"), Message("assistant", "ok")], (schema,)):
            supported.add("schemas")
        return supported

    def _try_render(self, messages, tools=(), line: int | None = None) -> str:
        try:
            return self.render(messages, tools)
        except TemplateLimitError as exc:  # the template is at fault, not this conversation: stop here
            raise self._refusal(exc, line) from None
        except Exception:  # a template may raise on roles or keys it does not know (jinja2 errors, TypeError, ...)
            return ""

    def check_tool_support(self, record: Record) -> None:
        missing = tool_needs(record.messages, record.tools) - self.tool_support
        if missing:
            raise ToolTemplateError(
                f"line {record.line} [template_cannot_render_tools]: the model's chat template cannot render "
                f"{describe_tool_features(missing)}; use a model whose template supports tools (e.g. Qwen2.5, "
                "Llama 3.1 Instruct), or remove the tools (`finetune validate DATA --model M` lists every such line)"
            )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text, in one call to the Rust tokenizer: per call, transformers' wrapper costs about
        as much as encoding a short piece, and a data file has millions of pieces."""
        if self._backend is None:
            return [self.encode(text) for text in texts]
        return [encoding.ids for encoding in self._backend.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_arrays(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text as int32 arrays: through the SegmentEncoder where it applies."""
        if self._segments is not None:
            return self._segments.encode(texts)
        return [np.array(ids, dtype=np.int32) for ids in self.encode_many(texts)]

    @cached_property
    def _segments(self) -> SegmentEncoder | None:
        return None if self._backend is None else SegmentEncoder.for_backend(self._backend)

    @cached_property
    def _backend(self):
        """The Rust tokenizer of a fast tokenizer, in the state every `encode` call leaves it in."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_batch_fast"):
            return None
        self.encode(" ")  # transformers sets the backend's truncation, padding and special-token splitting per call
        return backend

    def _find_end_of_turn(self) -> tuple[str, int]:
        """The special token the template writes right after an assistant message's content."""
        text = self.render([Message("user", "hi"), Message("assistant", _SENTINEL)])
        after = text[text.index(_SENTINEL) + len(_SENTINEL) :]
        ids = self.encode(after)
        special = set(self.tokenizer.all_special_ids) | {
            i for i, t in self.tokenizer.added_tokens_decoder.items() if t.special
        }
        if not ids or ids[0] not in special:
            raise UserError(
                "the chat template does not close an assistant message with a special token "
                f"(found {after[:20]!r} after the content); cannot teach the model when to stop"
            )
        eot_id = ids[0]
        return self.tokenizer.convert_ids_to_tokens(eot_id), eot_id

    def _closes_every_turn(self) -> bool:
        """Whether the template ends user turns with the end-of-turn token too (ChatML, Llama 3 do)."""
        text = self.render([Message("user", _SENTINEL), Message("assistant", "ok")])
        return text.startswith(self.end_of_turn_text, text.index(_SENTINEL) + len(_SENTINEL))

    def _pieces(self, record: Record) -> list[tuple[str, float]]:
        """Split the rendered record into (text, weight) pieces; weight 0 = context. A template that goes over
        its budget of work or size (data/template_sandbox.py) on this record stops the run here, naming where the
        template came from: every record could cost it the whole budget, so no record after it is tried."""
        try:
            return self._located_pieces(record)
        except TemplateLimitError as exc:
            raise self._refusal(exc, record.line) from None

    def _refusal(self, exc: TemplateLimitError, line: int | None) -> UserError:
        source = getattr(self.tokenizer, "finetune_template_source", "the chat template")
        where = f"at line {line}" if line else "on a conversation with tools (what it renders of them)"
        return UserError(f"{source}: the chat template was refused {where}: {exc}")

    def _located_pieces(self, record: Record) -> list[tuple[str, float]]:
        """The pieces of `_pieces`. Messages are located in order. An assistant reply is searched together with the end-of-turn
        that must follow it, so its text cannot be mistaken for a role header or an earlier message.
        """
        if record.tools or any(m.tool_calls or m.role == "tool" for m in record.messages):
            self.check_tool_support(record)
        try:
            text = self.render(record.messages, record.tools)
        except TemplateLimitError:
            raise
        except Exception as exc:  # templates raise what they refuse (e.g. "only single tool-calls are supported")
            raise RecordError(record.line, f"the chat template refuses this conversation: {exc}") from None
        eot = self.end_of_turn_text
        pieces: list[tuple[str, float]] = []
        cursor = 0  # start of the text not yet assigned to a piece
        search_from = 0  # never past the true start of the next message
        for i, message in enumerate(record.messages):
            if message.role == "assistant" and message.tool_calls:
                start, end = self._locate_calls(record, i, text, search_from)
            else:
                start, end = self._locate_content(record, i, text, search_from)
                if start < 0:
                    continue  # a template may rewrite context messages: only replies must be exact
            search_from = end + len(eot) if text.startswith(eot, end) else end
            if i not in record.targets:
                continue
            pieces.append((text[cursor:start], 0.0))
            pieces.append((text[start:end], message.weight))
            pieces.append((eot, message.weight))
            cursor = end + len(eot)
        # the tail after the last target is dropped: no target follows it, so it can never be scored
        return pieces

    def _locate_content(self, record: Record, i: int, text: str, search_from: int) -> tuple[int, int]:
        """Where message i's content is in the text: (start, end), or (-1, -1) for a context message not found."""
        message = record.messages[i]
        eot = self.end_of_turn_text
        content = message.content
        anchored = message.role == "assistant" or (self.closes_every_turn and message.role != "tool")
        start = text.find(content + eot if anchored else content, search_from)
        if start < 0 and content != content.strip():  # some templates trim contents
            content = content.strip()
            start = text.find(content + eot if anchored else content, search_from)
        if start < 0:
            if message.role != "assistant":
                return -1, -1
            raise RecordError(
                record.line,
                f"the chat template does not reproduce assistant message {i + 1} "
                f"followed by {eot!r}, so its tokens cannot be located",
            )
        return start, start + len(content)

    def _locate_calls(self, record: Record, i: int, text: str, search_from: int) -> tuple[int, int]:
        """Where assistant message i (with tool calls) starts and where its end-of-turn starts."""
        message = record.messages[i]
        starts = []
        for probe in _PROBES:
            messages = list(record.messages)
            messages[i] = Message("assistant", probe, message.weight)
            rendered = self._try_render(messages, record.tools, record.line)
            starts.append(len(os.path.commonprefix([text, rendered])))
        start = min(starts)
        end = text.find(self.end_of_turn_text, start)
        turn = text[start:end] if end >= 0 else ""
        if start < search_from or not all(call.name in turn for call in message.tool_calls):
            raise RecordError(
                record.line,
                f"the chat template does not render the tool calls of assistant message {i + 1} "
                f"inside its turn, followed by {self.end_of_turn_text!r}, so its tokens cannot be located",
            )
        return start, end

    def tokenize_arrays(self, record: Record, max_seq_len: int, truncation: Truncation | str) -> EncodedOutcome:
        """The record's token ids and weights as arrays (what `tokenize` returns, without per-token lists)."""
        return cut_to_length(self.tokenize_whole(record), max_seq_len, truncation)

    def tokenize_whole(self, record: Record) -> EncodedOutcome:
        """The whole record as arrays, never cut: `cut_to_length` then fits it to a limit."""
        pieces = self._pieces(record)
        encoded = self.encode_arrays([text for text, _ in pieces])
        input_ids = np.concatenate(encoded) if encoded else np.zeros(0, np.int32)
        piece_weights = np.array([weight for _, weight in pieces], dtype=np.float64)
        weights = np.repeat(piece_weights, [len(ids) for ids in encoded])
        return EncodedOutcome(input_ids, weights, None, len(input_ids), 0)

    def tokenize(self, record: Record, max_seq_len: int, truncation: Truncation | str) -> TokenizeOutcome:
        return as_lists(record, self.tokenize_arrays(record, max_seq_len, truncation))


def as_lists(record: Record, outcome: EncodedOutcome) -> TokenizeOutcome:
    """An EncodedOutcome of `record` as a TokenizeOutcome (a TokenizedRecord of lists, labels included)."""
    if outcome.input_ids is None:
        return TokenizeOutcome(None, outcome.dropped, outcome.total_tokens, outcome.cut_tokens)
    labels = np.where(outcome.weights > 0, outcome.input_ids, IGNORE_INDEX)
    tokenized = TokenizedRecord(
        outcome.input_ids.tolist(),
        labels.tolist(),
        outcome.weights.tolist(),
        record.conversation,
        record.line,
        outcome.cut_tokens,
    )
    return TokenizeOutcome(tokenized, None, outcome.total_tokens, outcome.cut_tokens)


def cut_to_length(whole: EncodedOutcome, max_seq_len: int, truncation: Truncation | str) -> EncodedOutcome:
    """A whole record (`tokenize_whole`) fitted to `max_seq_len`: context cut from the left, never a target;
    dropped ("target_would_be_cut") when the cut would reach a target, or ("too_long") with truncation drop."""
    input_ids, weights, total = whole.input_ids, whole.weights, whole.total_tokens
    cut = max(0, total - max_seq_len)
    if not cut:
        return whole
    first_target = int(np.flatnonzero(weights > 0)[0])  # a target token is one with a weight above 0
    if Truncation(truncation) is Truncation.DROP:
        return EncodedOutcome(None, None, "too_long", total, cut)
    # the first token is never predicted (nothing precedes it): it must stay context after the cut
    if cut >= first_target:
        return EncodedOutcome(None, None, "target_would_be_cut", total, cut)
    return EncodedOutcome(input_ids[cut:], weights[cut:], None, total, cut)


def check_masking(records: list[TokenizedRecord], end_of_turn_id: int, source: str) -> None:
    """Pre-flight proof of the masks: every record scores something, and end-of-turn is learned."""
    for record in records:
        if record.num_targets == 0:
            raise UserError(f"{source}:{record.line}: this record has no target tokens after tokenization")
        if record.labels[0] != IGNORE_INDEX:
            raise UserError(f"{source}:{record.line}: the first token is a target, so nothing predicts it")
    if records and not any(end_of_turn_id in r.labels for r in records):
        raise UserError(f"{source}: the end-of-turn token is never a target: the model would not learn to stop")
