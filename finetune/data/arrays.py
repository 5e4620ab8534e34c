"""Tokenized records in compact arrays: one flat buffer of token ids and one of loss weights for all records.

100,000 conversations are ~50 M tokens: as Python lists of ints (ids, labels, weights) that is ~3 GB, as
int32 ids + float32 weights it is 8 bytes a token, and the buffers can be memory-mapped from the token cache.

    records = TokenArrays.from_records(tokenized)    # or from the cache / the chunked tokenizer
    len(records), records.lengths, records.num_targets   # per-record numbers, no token touched
    records[i]                                          # one TokenizedRecord, materialized on demand
    records[::2], records[index_array]                  # subsets share the token buffers

Labels are not stored: a token is a target exactly when its weight is above 0 (tokenize.py writes label =
token id there and IGNORE_INDEX elsewhere), so they are rebuilt from the weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from finetune.data.types import IGNORE_INDEX, TokenizedRecord

RECORD_FIELDS = ("starts", "lengths", "num_targets", "conversation", "line", "truncated")


class TokenArrays(Sequence[TokenizedRecord]):
    """A sequence of TokenizedRecord kept as numpy arrays (see the module doc)."""

    def __init__(
        self,
        input_ids: np.ndarray,
        weights: np.ndarray,
        starts: np.ndarray,
        lengths: np.ndarray,
        num_targets: np.ndarray,
        conversation: np.ndarray,
        line: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        self.input_ids = input_ids  # int32 [tokens], shared by every subset
        self.weights = weights  # float32 [tokens]; 0 on context tokens
        self.starts = np.asarray(starts, dtype=np.int64)  # [records] offset of each record in the buffers
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.num_targets = np.asarray(num_targets, dtype=np.int64)
        self.conversation = np.asarray(conversation, dtype=np.int64)
        self.line = np.asarray(line, dtype=np.int64)
        self.truncated = np.asarray(truncated, dtype=np.int64)  # context tokens cut from the left

    @classmethod
    def empty(cls) -> TokenArrays:
        none = np.zeros(0, dtype=np.int64)
        return cls(np.zeros(0, np.int32), np.zeros(0, np.float32), none, none, none, none, none, none)

    @classmethod
    def from_records(cls, records: Iterable[TokenizedRecord]) -> TokenArrays:
        records = list(records)
        if not records:
            return cls.empty()
        lengths = np.array([len(r) for r in records], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return cls(
            np.fromiter((t for r in records for t in r.input_ids), dtype=np.int32, count=int(lengths.sum())),
            np.fromiter((w for r in records for w in r.weights), dtype=np.float32, count=int(lengths.sum())),
            starts,
            lengths,
            np.array([r.num_targets for r in records], dtype=np.int64),
            np.array([r.conversation for r in records], dtype=np.int64),
            np.array([r.line for r in records], dtype=np.int64),
            np.array([r.truncated_tokens for r in records], dtype=np.int64),
        )

    # ---- the Sequence protocol: what the loop, the evaluation and the tests use

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index):
        if isinstance(index, slice | list | np.ndarray):
            return self.subset(np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index))
        return self.record(int(index))

    def __iter__(self) -> Iterator[TokenizedRecord]:
        return (self.record(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:  # like a list of its records
        if not isinstance(other, TokenArrays | list | tuple):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # mutable arrays, compared by value

    def __repr__(self) -> str:
        return f"TokenArrays({len(self)} records, {self.total_tokens} tokens)"

    def record(self, i: int) -> TokenizedRecord:
        if i < 0:
            i += len(self)
        start, end = int(self.starts[i]), int(self.starts[i] + self.lengths[i])
        ids = np.asarray(self.input_ids[start:end])
        weights = np.asarray(self.weights[start:end])
        labels = np.where(weights > 0, ids, IGNORE_INDEX)
        return TokenizedRecord(
            ids.tolist(),
            labels.tolist(),
            weights.tolist(),
            int(self.conversation[i]),
            int(self.line[i]),
            int(self.truncated[i]),
        )

    def subset(self, index: np.ndarray) -> TokenArrays:
        """The records at `index` (in that order), sharing the token buffers."""
        picked = {name: getattr(self, name)[index] for name in RECORD_FIELDS}
        return TokenArrays(self.input_ids, self.weights, **picked)

    # ---- whole-set numbers, without materializing records

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum())

    @property
    def total_targets(self) -> int:
        return int(self.num_targets.sum())


def record_lengths(records: Sequence[TokenizedRecord]) -> list[int]:
    """Token count of every record; O(records) for TokenArrays (no token is touched)."""
    if isinstance(records, TokenArrays):
        return records.lengths.tolist()
    return [len(r) for r in records]
