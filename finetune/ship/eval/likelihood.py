"""Teacher-forced log-probabilities of given continuations, in batches: option scores and the KL between two models.

A row is (context ids, target ids). Rows are left-padded into one batch (position ids restart after the padding,
so a padded row scores as it would alone), and only the logits that predict target tokens are computed.

    target_log_probs(model, rows)          -> log p of every target token, per row
    kl_per_row(tuned, base, rows)          -> KL(tuned || base) summed over target tokens, and their count, per row

KL(tuned || base) at one position is sum_v p_tuned(v) * (log p_tuned(v) - log p_base(v)) over the vocabulary,
the next-token distributions of the two models given the same prefix: how surprised the base would be, on
average, by what the tuned model predicts. 0 when they agree exactly; never negative.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch

Row = tuple[list[int], list[int]]  # (context ids, target ids)


def _batches(rows: list[Row], batch_size: int) -> Iterator[list[int]]:
    """Row indices in batches of similar length (less padding), each batch in the original order."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]) + len(rows[i][1]))
    for start in range(0, len(order), batch_size):
        yield sorted(order[start : start + batch_size])


def _target_logits(model, rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits [B, T, V] predicting each target slot, target ids [B, T], mask [B, T]); targets right-aligned."""
    width = max(len(c) + len(t) for c, t in rows)
    keep = max(len(t) for _, t in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), keep), dtype=torch.bool)
    for i, (context, target) in enumerate(rows):
        sequence = list(context) + list(target)
        ids[i, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
        attention[i, width - len(sequence) :] = 1
        mask[i, keep - len(target) :] = True
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    device = model.device
    # the last keep+1 logits: position j predicts token j+1, so the final one (after the last token) is dropped
    logits = model(
        input_ids=ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        use_cache=False,
        logits_to_keep=keep + 1,
    ).logits[:, :-1, :]
    return logits.float(), ids[:, width - keep :].to(device), mask.to(device)


@torch.inference_mode()
def target_log_probs(model, rows: list[Row], pad_id: int, batch_size: int = 16) -> list[list[float]]:
    """log p(target token | context, earlier target tokens) for every target token of every row."""
    model.eval()
    out: list[list[float]] = [[] for _ in rows]
    for batch in _batches(rows, batch_size):
        logits, targets, mask = _target_logits(model, [rows[i] for i in batch], pad_id)
        picked = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        for j, i in enumerate(batch):
            out[i] = picked[j][mask[j]].tolist()
    return out


@torch.inference_mode()
def kl_per_row(
    tuned: Callable[[], AbstractContextManager],
    base: Callable[[], AbstractContextManager],
    rows: list[Row],
    pad_id: int,
    batch_size: int = 16,
) -> list[tuple[float, int]]:
    """(sum of KL(tuned || base) over the row's target tokens, number of target tokens) for every row.

    `tuned` and `base` are context managers giving a model: the same PEFT model with its adapter on and off
    shares one copy of the base weights."""
    out: list[tuple[float, int]] = [(0.0, 0) for _ in rows]
    for batch in _batches(rows, batch_size):
        chunk = [rows[i] for i in batch]
        with tuned() as model:
            model.eval()
            tuned_logits, _, mask = _target_logits(model, chunk, pad_id)
        with base() as model:
            model.eval()
            base_logits, _, _ = _target_logits(model, chunk, pad_id)
        vocab = min(tuned_logits.shape[-1], base_logits.shape[-1])  # a resized vocabulary: compare what both have
        for j, i in enumerate(batch):  # a row at a time: the whole batch's vocabulary-wide terms took gigabytes
            log_t = torch.log_softmax(tuned_logits[j, :, :vocab], dim=-1)
            log_b = torch.log_softmax(base_logits[j, :, :vocab], dim=-1)
            kl = (log_t.exp() * (log_t - log_b)).sum(-1).clamp(min=0.0)  # rounding can dip a hair below 0
            out[i] = (float(kl[mask[j]].sum()), int(mask[j].sum()))
    return out
