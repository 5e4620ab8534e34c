"""Records -> token ids and labels, with the model's own chat template.

We do not rely on `return_assistant_tokens_mask` (stock templates rarely carry `{% generation %}`
markers, so it often comes back all zeros). Instead the conversation is rendered to text once, the
content of every target reply is located in that text, and the text is tokenized piece by piece:

    [context ... ][target content][end-of-turn][context ...][target content][end-of-turn][tail]

so the target tokens of a message are exactly its content tokens plus the end-of-turn token that
closes it, whatever the template puts around them (role headers, `<think></think>` blocks, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from finetune.data.types import IGNORE_INDEX, Record, TokenizedRecord, Truncation
from finetune.errors import UserError

_SENTINEL = "FINETUNE-SENTINEL-7f3a"


@dataclass(frozen=True)
class TokenizeOutcome:
    record: TokenizedRecord | None  # None when the record was dropped
    dropped: str | None  # "too_long" | "target_would_be_cut" when dropped
    total_tokens: int  # tokens before truncation
    cut_tokens: int  # context tokens cut from the left (kept record) or that would have to be (dropped)


def load_tokenizer(model: str, trust_remote_code: bool = False):
    """The model's tokenizer, with a clear error instead of a traceback."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types here (OSError, ValueError, HF hub errors)
        raise UserError(f"cannot load the tokenizer of {model!r}: {exc}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"the tokenizer of {model!r} has no chat template; use an instruct/chat model")
    return tokenizer


class ChatTokenizer:
    """Tokenizes records with a tokenizer's chat template and marks exactly the target tokens."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn_text, self.end_of_turn_id = self._find_end_of_turn()
        self.closes_every_turn = self._closes_every_turn()

    def render(self, messages) -> str:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        return self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text, in one call to the Rust tokenizer: per call, transformers' wrapper costs about
        as much as encoding a short piece, and a data file has millions of pieces."""
        if self._backend is None:
            return [self.encode(text) for text in texts]
        return [encoding.ids for encoding in self._backend.encode_batch_fast(texts, add_special_tokens=False)]

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
        text = self.render(record.messages)
        eot = self.end_of_turn_text
        pieces: list[tuple[str, float]] = []
        cursor = 0  # start of the text not yet assigned to a piece
        search_from = 0  # never past the true start of the next message
        for i, message in enumerate(record.messages):
            content = message.content
            anchored = message.role == "assistant" or self.closes_every_turn
            start = text.find(content + eot if anchored else content, search_from)
            if start < 0 and content != content.strip():  # some templates trim contents
                content = content.strip()
                start = text.find(content + eot if anchored else content, search_from)
            if start < 0:
                if message.role != "assistant":
                    continue  # a template may rewrite context messages: only replies must be exact
                raise UserError(
                    f"line {record.line}: the chat template does not reproduce assistant message {i + 1} "
                    f"followed by {eot!r}, so its tokens cannot be located"
                )
            end = start + len(content)
            search_from = end + len(eot) if text.startswith(eot, end) else end
            if i not in record.targets:
                continue
            pieces.append((text[cursor:start], 0.0))
            pieces.append((text[start:end], message.weight))
            pieces.append((eot, message.weight))
            cursor = end + len(eot)
        # the tail after the last target is dropped: no target follows it, so it can never be scored
        return pieces

    def tokenize(self, record: Record, max_seq_len: int, truncation: Truncation | str) -> TokenizeOutcome:
        input_ids: list[int] = []
        labels: list[int] = []
        weights: list[float] = []
        pieces = self._pieces(record)
        for (_, weight), ids in zip(pieces, self.encode_many([text for text, _ in pieces]), strict=True):
            input_ids += ids
            labels += ids if weight > 0 else [IGNORE_INDEX] * len(ids)
            weights += [weight] * len(ids)

        total = len(input_ids)
        cut = max(0, total - max_seq_len)
        if cut:
            first_target = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
            if Truncation(truncation) is Truncation.DROP:
                return TokenizeOutcome(None, "too_long", total, cut)
            # the first token is never predicted (nothing precedes it): it must stay context after the cut
            if cut >= first_target:
                return TokenizeOutcome(None, "target_would_be_cut", total, cut)
            input_ids, labels, weights = input_ids[cut:], labels[cut:], weights[cut:]
        tokenized = TokenizedRecord(input_ids, labels, weights, record.conversation, record.line, cut)
        return TokenizeOutcome(tokenized, None, total, cut)


def check_masking(records: list[TokenizedRecord], end_of_turn_id: int, source: str) -> None:
    """Pre-flight proof of the masks: every record scores something, and end-of-turn is learned."""
    for record in records:
        if record.num_targets == 0:
            raise UserError(f"{source}:{record.line}: this record has no target tokens after tokenization")
        if record.labels[0] != IGNORE_INDEX:
            raise UserError(f"{source}:{record.line}: the first token is a target, so nothing predicts it")
    if records and not any(end_of_turn_id in r.labels for r in records):
        raise UserError(f"{source}: the end-of-turn token is never a target: the model would not learn to stop")
