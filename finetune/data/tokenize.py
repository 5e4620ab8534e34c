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
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from finetune.data.formats.openai import parse_arguments
from finetune.data.types import IGNORE_INDEX, Message, Record, TokenizedRecord, ToolCall, Truncation
from finetune.errors import RecordError, UserError

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

    from finetune.model_source import local_model

    try:
        tokenizer = AutoTokenizer.from_pretrained(local_model(model), trust_remote_code=trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # transformers raises many types here (OSError, ValueError, HF hub errors)
        raise UserError(f"cannot load the tokenizer of {model!r}: {exc}") from None
    return use_chat_template(tokenizer, chat_template)


# ----------------------------------------------------------------------------- the chat template

CHATML = "chatml"
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")


def chatml_template() -> str:
    """ChatML (`<|im_start|>role\ncontent<|im_end|>`), with tools the way Qwen2.5 / Hermes templates write them."""
    from finetune.toy import CHAT_TEMPLATE  # the toy model's template is exactly this

    return CHAT_TEMPLATE


def use_chat_template(tokenizer, setting: str = "auto"):
    """Give `tokenizer` the chat template the `--chat-template` setting names, and return it.

    auto: the model's own template; ChatML when it has none (a base model). chatml: ChatML. Otherwise a path
    to a Jinja file. ChatML's two special tokens are added where the vocabulary lacks them, as TRL's chat-format
    set-up does (load_model then grows the embeddings to match; the end of turn is `<|im_end|>`).
    """
    if setting == "auto":
        if getattr(tokenizer, "chat_template", None):
            return tokenizer
        setting = CHATML
    if setting == CHATML:
        vocabulary = tokenizer.get_vocab()
        missing = [token for token in CHATML_TOKENS if token not in vocabulary]
        if missing:
            tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
        tokenizer.chat_template = chatml_template()
        return tokenizer
    tokenizer.chat_template = read_template_file(setting)
    return tokenizer


def read_template_file(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(
            f"--chat-template {path}: not auto, chatml or a readable Jinja file ({exc.__class__.__name__})"
        ) from None
    if not text.strip():
        raise UserError(f"--chat-template {path}: the file is empty")
    return text


def has_own_template(model: str) -> bool | None:
    """Whether a model's tokenizer carries a chat template, read from its files without loading it; None when
    that cannot be told here (a hub id that is not in the local cache)."""
    path = Path(model).expanduser()
    if path.is_file() and path.name.lower().endswith(".gguf"):
        from finetune.gguf_model import read_header

        return read_header(path).chat_template is not None
    if not path.is_dir():
        from finetune.bases import converted, find_base

        base = find_base(model)
        path = converted(base) if base is not None else None
        if path is None:
            return _hub_template(model)
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return bool(config.get("chat_template")) if isinstance(config, dict) else None


def _hub_template(model: str) -> bool | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        for name in ("chat_template.jinja", "tokenizer_config.json"):
            cached = try_to_load_from_cache(model, name)
            if isinstance(cached, str):
                return has_own_template(str(Path(cached).parent))
    except Exception:  # not a hub id, or no cache: unknown
        return None
    return None


def describe_chat_template(model: str | None, setting: str = "auto") -> tuple[str, str | None]:
    """(the template a run uses, Auto's reason when the setting is auto): "model" (its own), "chatml", or the
    Jinja file's path; for the plan, which says which template is used and why."""
    if setting != "auto":
        if setting != CHATML:
            read_template_file(setting)  # a bad path fails at plan time, not after the data is read
        return setting, None
    if not model:
        return "auto", None
    own = has_own_template(model)
    if own:
        return "model", "auto: the model's tokenizer carries a chat template, and the data is rendered with it"
    if own is None:
        return "auto", (
            "auto: the model's own chat template, or ChatML when it has none (known once its tokenizer loads)"
        )
    return CHATML, (
        "auto: the model has no chat template (a base model), so ChatML, the documented default: "
        "<|im_start|>/<|im_end|> added as special tokens where missing (the embeddings grow to match), "
        "<|im_end|> ends each turn"
    )


@dataclass(frozen=True)
class EncodedOutcome:
    """`TokenizeOutcome` as arrays: what the data path keeps (no Python list per token)."""

    input_ids: np.ndarray | None  # int32 [tokens] after truncation; None when the record was dropped
    weights: np.ndarray | None  # float64 [tokens] (the messages' weights exactly; 0 on context tokens)
    dropped: str | None
    total_tokens: int
    cut_tokens: int


# Pre-tokenizers that treat every stretch of text between two added tokens alike, wherever it stands in the
# text. Metaspace with prepend_scheme "first" does not (only the text's first stretch gets the prefix), and
# an unknown one might not: for those, texts are encoded whole.
_POSITION_FREE = {
    "ByteLevel",
    "Split",
    "Digits",
    "Whitespace",
    "WhitespaceSplit",
    "Punctuation",
    "BertPreTokenizer",
    "CharDelimiterSplit",
    "UnicodeScripts",
}
_SEGMENT_CACHE_CHARS = 4 << 20  # per process; cleared when full (the common segments come straight back)


def _position_free(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_position_free(p) for p in pre_tokenizer.get("pretokenizers", ()))
    if kind == "Metaspace":
        return pre_tokenizer.get("prepend_scheme", "always") in ("always", "never")
    return kind in _POSITION_FREE


class SegmentEncoder:
    """`encode` of many texts, token for token, with the text between added tokens encoded once per process.

    The Rust tokenizer first cuts a text at its added tokens (leftmost-longest) and then normalizes,
    pre-tokenizes and encodes each stretch between them on its own; so the ids of a text are the ids of its
    stretches and added tokens, one after the other. A data file repeats many stretches (the system prompt of
    every exported conversation, role headers, canned replies): those are looked up, not encoded again.
    Built only where that holds (`for_backend`), and checked on probe texts before use.
    """

    def __init__(self, backend, added_tokens: list[str]) -> None:
        self.backend = backend
        alternatives = "|".join(re.escape(t) for t in sorted(added_tokens, key=len, reverse=True))
        self._split = re.compile(f"({alternatives})").split
        self._cache: dict[str, np.ndarray] = {}
        self._cached_chars = 0

    @classmethod
    def for_backend(cls, backend) -> SegmentEncoder | None:
        """An encoder for this Rust tokenizer (in the state `encode` leaves it in), or None where cutting a text
        at its added tokens could change its ids."""
        if getattr(backend, "encode_special_tokens", True) or backend.truncation or backend.padding:
            return None
        added = list(backend.get_added_tokens_decoder().values())
        if not added or any(t.lstrip or t.rstrip or t.single_word for t in added):
            return None  # stripping or word-bound tokens reach across the cut
        pre_tokenizer = backend.pre_tokenizer
        if pre_tokenizer is not None and not _position_free(json.loads(pre_tokenizer.__getstate__())):
            return None
        cut_at = [t.content for t in added if not t.normalized]  # normalized ones are found within a stretch
        if not cut_at:
            return None
        encoder = cls(backend, cut_at)
        return encoder if encoder._agrees_on_probes([t.content for t in added]) else None

    def _agrees_on_probes(self, added: list[str]) -> bool:
        joined = "".join(f" Hello{t}  wörld\n\t{t}{t}x 12 " for t in added[:32])
        texts = ["", " ", "Hi there", joined, f"{added[0]}start", f"end {added[-1]}", " " + joined.strip()]
        whole = [e.ids for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
        cut = [ids.tolist() for ids in self.encode(texts)]
        self._cache.clear()
        self._cached_chars = 0
        return whole == cut

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        stretches = [[s for s in self._split(text) if s] for text in texts]
        known = {s: self._cache.get(s) for parts in stretches for s in parts}
        missing = [s for s, ids in known.items() if ids is None]
        if missing:
            encoded = self.backend.encode_batch_fast(missing, add_special_tokens=False)
            size = sum(map(len, missing))
            if self._cached_chars + size > _SEGMENT_CACHE_CHARS:
                self._cache.clear()
                self._cached_chars = 0
            self._cached_chars += size
            for stretch, encoding in zip(missing, encoded, strict=True):
                known[stretch] = self._cache[stretch] = np.array(encoding.ids, dtype=np.int32)
        return [np.concatenate([known[s] for s in parts]) if parts else np.zeros(0, np.int32) for parts in stretches]


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

    def _try_render(self, messages, tools=()) -> str:
        try:
            return self.render(messages, tools)
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
        from finetune.data.types import Message

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
        from finetune.data.types import Message

        text = self.render([Message("user", _SENTINEL), Message("assistant", "ok")])
        return text.startswith(self.end_of_turn_text, text.index(_SENTINEL) + len(_SENTINEL))

    def _pieces(self, record: Record) -> list[tuple[str, float]]:
        """Split the rendered record into (text, weight) pieces; weight 0 = context.

        Messages are located in order. An assistant reply is searched together with the end-of-turn
        that must follow it, so its text cannot be mistaken for a role header or an earlier message.
        """
        if record.tools or any(m.tool_calls or m.role == "tool" for m in record.messages):
            self.check_tool_support(record)
        try:
            text = self.render(record.messages, record.tools)
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
            rendered = self._try_render(messages, record.tools)
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
        pieces = self._pieces(record)
        encoded = self.encode_arrays([text for text, _ in pieces])
        input_ids = np.concatenate(encoded) if encoded else np.zeros(0, np.int32)
        piece_weights = np.array([weight for _, weight in pieces], dtype=np.float64)
        weights = np.repeat(piece_weights, [len(ids) for ids in encoded])

        total = len(input_ids)
        cut = max(0, total - max_seq_len)
        if cut:
            first_target = int(np.flatnonzero(weights > 0)[0])  # a target token is one with a weight above 0
            if Truncation(truncation) is Truncation.DROP:
                return EncodedOutcome(None, None, "too_long", total, cut)
            # the first token is never predicted (nothing precedes it): it must stay context after the cut
            if cut >= first_target:
                return EncodedOutcome(None, None, "target_would_be_cut", total, cut)
            input_ids, weights = input_ids[cut:], weights[cut:]
        return EncodedOutcome(input_ids, weights, None, total, cut)

    def tokenize(self, record: Record, max_seq_len: int, truncation: Truncation | str) -> TokenizeOutcome:
        outcome = self.tokenize_arrays(record, max_seq_len, truncation)
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


def check_masking(records: list[TokenizedRecord], end_of_turn_id: int, source: str) -> None:
    """Pre-flight proof of the masks: every record scores something, and end-of-turn is learned."""
    for record in records:
        if record.num_targets == 0:
            raise UserError(f"{source}:{record.line}: this record has no target tokens after tokenization")
        if record.labels[0] != IGNORE_INDEX:
            raise UserError(f"{source}:{record.line}: the first token is a target, so nothing predicts it")
    if records and not any(end_of_turn_id in r.labels for r in records):
        raise UserError(f"{source}: the end-of-turn token is never a target: the model would not learn to stop")
