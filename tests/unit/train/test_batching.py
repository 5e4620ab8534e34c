"""Step composition: which records make each step depends only on (seed, epoch, effective batch)."""

from __future__ import annotations

import pytest

from finetune.train.batching import pack_batch, pack_rows
from finetune.train.order import epoch_steps, micro_batches, passes


def test_every_record_once_per_epoch_and_reshuffled():
    first = epoch_steps(50, 8, seed=1, epoch=0, last_batch="keep")
    second = epoch_steps(50, 8, seed=1, epoch=1, last_batch="keep")
    assert sorted(i for step in first for i in step) == list(range(50))
    assert sorted(i for step in second for i in step) == list(range(50))
    assert first != second  # a new order every epoch
    assert first == epoch_steps(50, 8, seed=1, epoch=0, last_batch="keep")  # deterministic


@pytest.mark.parametrize(("last_batch", "steps", "last_size"), [("keep", 7, 2), ("drop", 6, 8)])
def test_partial_last_batch_kept_or_dropped(last_batch, steps, last_size):
    plan = epoch_steps(50, 8, seed=0, epoch=0, last_batch=last_batch)
    assert len(plan) == steps
    assert len(plan[-1]) == last_size


@pytest.mark.parametrize(("devices", "grad_accum"), [(1, 1), (1, 4), (2, 2), (4, 1), (3, 3)])
def test_micro_batches_cover_the_step_exactly(devices, grad_accum):
    step = list(range(10, 30))
    lengths = [(i * 7) % 23 + 1 for i in range(40)]
    parts = [micro_batches(step, lengths, devices, grad_accum, rank) for rank in range(devices)]
    flat = sorted(i for rank_parts in parts for micro in rank_parts for i in micro)
    assert flat == step
    assert all(len(rank_parts) <= grad_accum for rank_parts in parts)


@pytest.mark.parametrize("budget", [1, 30, 64, 500])
def test_passes_keep_whole_records_in_order_within_the_budget(budget):
    micro = [5, 2, 9, 7, 1, 3]
    lengths = [(i * 11) % 37 + 4 for i in range(10)]
    cut = passes(micro, lengths, budget)
    assert [i for part in cut for i in part] == micro  # every record once, in the micro-batch's order
    assert all(sum(lengths[i] for i in part) <= budget or len(part) == 1 for part in cut)
    # greedy: a pass ends only where the next record would not fit
    assert all(sum(lengths[i] for i in a) + lengths[b[0]] > budget for a, b in zip(cut, cut[1:], strict=False))
    assert passes(micro, lengths, None) == [micro]


def test_rows_are_bounded_and_lose_nothing(records):
    rows = pack_rows(records, 64)
    assert all(sum(len(r) for r in row) <= 64 for row in rows)
    assert sorted(id(r) for row in rows for r in row) == sorted(id(r) for r in records)
    batch = pack_batch(records, 64, pad_id=0)
    assert batch.num_tokens == sum(len(r) for r in records)
    # positions restart at 0 for each record: the model sees each record alone
    assert int((batch.position_ids == 0).sum()) >= len(records)
