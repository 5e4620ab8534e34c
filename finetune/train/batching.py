"""How a micro-batch's records become tensors: packed padding-free into rows, or padded.

Which records make each step and each micro-batch is order.py's business.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from finetune.data.types import IGNORE_INDEX, TokenizedRecord


@dataclass
class Batch:
    """Model inputs plus next-token targets, already shifted: targets[r, i] is the token after input i."""

    input_ids: torch.Tensor  # [rows, length]
    position_ids: torch.Tensor  # [rows, length]; restarts at 0 for every packed record
    targets: torch.Tensor  # [rows, length], IGNORE_INDEX where nothing is scored
    weights: torch.Tensor  # [rows, length], float loss weight per target (0 elsewhere)
    attention_mask: torch.Tensor | None  # only on the padded path; None lets the model build a packed mask
    num_tokens: int  # real (non-padding) tokens
    # Packed batches only, for variable-length attention (FlashAttention's varlen path, or attention.py's SDPA one):
    # the records laid end to end in one row, without the filler that makes the rows rectangular.
    flat_index: torch.Tensor | None = None  # [num_tokens] positions of the real tokens in the flattened rows
    cu_seq_lens: torch.Tensor | None = None  # int32 [records + 1]: where each record starts in that flat row
    max_record_len: int = 0

    @property
    def num_targets(self) -> int:
        return int((self.targets != IGNORE_INDEX).sum())

    def to(self, device: torch.device | str) -> Batch:
        """On a GPU the copies come from pinned (page-locked) memory, so non_blocking really overlaps them with
        the work already queued; from ordinary memory a non-blocking copy to the GPU is a synchronous one."""
        pin = torch.device(device).type == "cuda"
        move = lambda t: None if t is None else (t.pin_memory() if pin else t).to(device, non_blocking=True)  # noqa: E731
        return Batch(
            move(self.input_ids),
            move(self.position_ids),
            move(self.targets),
            move(self.weights),
            move(self.attention_mask),
            self.num_tokens,
            move(self.flat_index),
            move(self.cu_seq_lens),
            self.max_record_len,
        )


def _shifted(record: TokenizedRecord) -> tuple[list[int], list[float]]:
    """Targets aligned with inputs: position i predicts token i + 1; the last position predicts nothing."""
    return record.labels[1:] + [IGNORE_INDEX], record.weights[1:] + [0.0]


def pack_rows(records: list[TokenizedRecord], max_row_len: int) -> list[list[TokenizedRecord]]:
    """First-fit decreasing: records into rows of at most max_row_len tokens (a longer record gets its own row)."""
    rows: list[list[TokenizedRecord]] = []
    room: list[int] = []
    for record in sorted(records, key=len, reverse=True):
        for r, free in enumerate(room):
            if len(record) <= free:
                rows[r].append(record)
                room[r] -= len(record)
                break
        else:
            rows.append([record])
            room.append(max_row_len - len(record))
    return rows


def pack_batch(records: list[TokenizedRecord], max_row_len: int, pad_id: int) -> Batch:
    """Padding-free packing: records concatenated into rows, positions restarting per record.

    Rows are bounded by max_row_len because SDPA's block-diagonal mask costs the square of the row
    length. Rows shorter than the longest are filled with pad tokens that form their own segment
    and are never scored; with first-fit decreasing that filler is small. With variable-length
    attention the loss drops the filler altogether (flat_index, cu_seq_lens): one row, no padding.
    """
    rows = pack_rows(records, max_row_len)
    width = max(sum(len(r) for r in row) for row in rows)
    ids, pos, tgt, wts = [], [], [], []
    flat_index: list[int] = []
    record_lens: list[int] = []
    for r, row in enumerate(rows):
        row_ids: list[int] = []
        row_pos: list[int] = []
        row_tgt: list[int] = []
        row_wts: list[float] = []
        for record in row:
            targets, weights = _shifted(record)
            row_ids += record.input_ids
            row_pos += range(len(record))
            row_tgt += targets
            row_wts += weights
            record_lens.append(len(record))
        flat_index += range(r * width, r * width + len(row_ids))
        fill = width - len(row_ids)
        ids.append(row_ids + [pad_id] * fill)
        pos.append(row_pos + list(range(fill)))
        tgt.append(row_tgt + [IGNORE_INDEX] * fill)
        wts.append(row_wts + [0.0] * fill)
    cu_seq_lens = torch.tensor([0, *itertools.accumulate(record_lens)], dtype=torch.int32)
    return Batch(
        torch.tensor(ids),
        torch.tensor(pos),
        torch.tensor(tgt),
        torch.tensor(wts, dtype=torch.float32),
        None,
        sum(len(r) for r in records),
        torch.tensor(flat_index),
        cu_seq_lens,
        max(record_lens),
    )


def pad_batch(records: list[TokenizedRecord], pad_id: int) -> Batch:
    """The classic padded batch: one record per row, right-padded, with an attention mask."""
    width = max(len(r) for r in records)
    ids, pos, tgt, wts, mask = [], [], [], [], []
    for record in records:
        fill = width - len(record)
        targets, weights = _shifted(record)
        ids.append(record.input_ids + [pad_id] * fill)
        pos.append(list(range(width)))
        tgt.append(targets + [IGNORE_INDEX] * fill)
        wts.append(weights + [0.0] * fill)
        mask.append([1] * len(record) + [0] * fill)
    return Batch(
        torch.tensor(ids),
        torch.tensor(pos),
        torch.tensor(tgt),
        torch.tensor(wts, dtype=torch.float32),
        torch.tensor(mask),
        sum(len(r) for r in records),
    )
