"""The run's arithmetic: the issue's worked examples, the partial last batch, one example, more devices than examples."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from finetune.plan.build import build_plan
from finetune.plan.what_if import what_if_summary
from finetune.rules import arithmetic
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError


def make(examples: int, tokens: int | None = None, **settings):
    config = RunConfig(**settings)
    return build_plan(config, what_if_summary(config, examples, tokens))


# ----------------------------------------------------------------------------- the worked examples


def test_800_records_batch_8_three_epochs():
    assert arithmetic.effective_batch(8, 1, 1) == 8
    assert arithmetic.steps_per_epoch(800, 8) == 100
    assert arithmetic.total_steps(100, 3) == 300
    assert arithmetic.warmup_steps(0.05, 300) == 15


def test_800_records_batch_32():
    assert arithmetic.steps_per_epoch(800, 32) == 25
    assert arithmetic.total_steps(25, 3) == 75


def test_accumulation_and_devices_multiply():
    assert arithmetic.effective_batch(4, 8, 1) == 32
    assert arithmetic.effective_batch(4, 2, 4) == 32


def test_tokens_processed():
    assert arithmetic.tokens_processed(400_000, 3) == 1_200_000


def test_plan_obeys_the_worked_examples():
    plan = make(800, 400_000, epochs=3, batch_size=8)
    assert (plan.effective_batch, plan.steps_per_epoch, plan.total_steps, plan.warmup_steps) == (8, 100, 300, 15)
    assert plan.tokens_processed == 1_200_000 and plan.tokens_exact
    assert plan.times_each_example_seen == 3
    plan = make(800, epochs=3, batch_size=32)
    assert (plan.steps_per_epoch, plan.total_steps) == (25, 75)
    plan = make(800, epochs=3, batch_size=4, grad_accum=8, devices=1)
    assert (plan.effective_batch, plan.steps_per_epoch) == (32, 25)


# ----------------------------------------------------------------------------- edge cases


def test_partial_last_batch_kept_or_dropped():
    assert arithmetic.steps_per_epoch(801, 8, "keep") == 101
    assert arithmetic.steps_per_epoch(801, 8, "drop") == 100
    assert arithmetic.steps_per_epoch(800, 8, "drop") == 100  # no partial batch: both agree


def test_dropped_last_batch_processes_fewer_tokens():
    plan = make(801, 80_100, epochs=2, batch_size=8, last_batch="drop")
    assert plan.total_steps == 200
    assert plan.tokens_processed == round(80_100 * 2 * 800 / 801)
    assert not plan.tokens_exact


def test_one_example():
    plan = make(1, epochs=3, batch_size=8)
    assert (plan.effective_batch, plan.steps_per_epoch, plan.total_steps) == (8, 1, 3)
    auto = make(1)
    assert auto.batch_size == 1 and auto.steps_per_epoch == 1
    with pytest.raises(UserError, match="last-batch"):
        make(1, batch_size=8, last_batch="drop")


def test_more_devices_than_examples():
    plan = make(3, epochs=2, batch_size=1, devices=4)
    assert plan.effective_batch == 4 and plan.steps_per_epoch == 1 and plan.total_steps == 2
    with pytest.raises(UserError):
        make(3, epochs=2, batch_size=1, devices=4, last_batch="drop")


def test_no_records_is_an_error():
    with pytest.raises(UserError):
        arithmetic.steps_per_epoch(0, 8)
    with pytest.raises(UserError):
        make(0)


def test_warmup_rounds_and_given_steps_are_capped():
    assert arithmetic.warmup_steps(0.05, 39) == 2  # 1.95
    assert arithmetic.warmup_steps(0.0, 300) == 0
    plan = make(800, epochs=3, batch_size=8, warmup_ratio=0.1)
    assert plan.warmup_steps == 30
    plan = make(80, epochs=1, batch_size=8, warmup_steps=50)
    assert plan.total_steps == 10 and plan.warmup_steps == 10  # never longer than the run


def test_max_steps_cuts_the_run():
    plan = make(800, 400_000, epochs=3, batch_size=8, max_steps=150)
    assert plan.planned_steps == 300 and plan.total_steps == 150
    assert plan.warmup_steps == round(0.05 * 150)
    assert plan.times_each_example_seen == 1.5
    assert plan.tokens_processed == 600_000 and not plan.tokens_exact


@given(
    records=st.integers(1, 100_000),
    batch=st.integers(1, 64),
    accum=st.integers(1, 16),
    devices=st.integers(1, 8),
    epochs=st.integers(1, 5),
)
def test_steps_cover_every_record_exactly_once_per_epoch(records, batch, accum, devices, epochs):
    effective = arithmetic.effective_batch(batch, accum, devices)
    keep = arithmetic.steps_per_epoch(records, effective, "keep")
    drop = arithmetic.steps_per_epoch(records, effective, "drop")
    assert keep == math.ceil(records / effective) and (keep - 1) * effective < records <= keep * effective
    assert drop == records // effective and drop * effective <= records
    assert keep - drop in (0, 1)
    assert arithmetic.total_steps(keep, epochs) == keep * epochs
