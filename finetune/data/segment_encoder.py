"""Encoding many texts token for token, with the text between added tokens encoded once per process."""

from __future__ import annotations

import json
import re

import numpy as np

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
