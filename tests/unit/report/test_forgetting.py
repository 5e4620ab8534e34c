"""The report reads the forgetting curve: fit and drift steps as docs/report.md defines them, numbers that agree
with the rows they come from, and nothing at all for a run without the curve."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from finetune.report.diagnosis import MIN_LOSS_CHANGE
from finetune.report.forgetting import DRIFT_REL, FIT_REL, read_forgetting
from finetune.report.summary import print_summary


def _rows(val: list[float | None], general: list[float | None], base: float | None = None, every: int = 2):
    """A run of len(val) evaluations, one every `every` steps (train rows between them)."""
    rows = []
    for i in range(len(val) * every):
        step = i + 1
        row = {"step": step, "epoch": step / 10, "learning_rate": 1e-3, "train_loss": 2.0 - step / 100}
        if step == 1 and base is not None:
            row["general_val_loss_base"] = base
        if step % every == 0:
            k = step // every - 1
            if val[k] is not None:
                row["val_loss"] = val[k]
            if general[k] is not None:
                row["general_val_loss"] = general[k]
        rows.append(row)
    return rows


def test_a_run_without_the_curve_has_no_section():
    assert read_forgetting(_rows([2.0, 1.0, 0.5], [None, None, None])) is None
    assert read_forgetting([]) is None


def test_fit_and_drift_steps_on_a_constructed_run():
    # validation 2.0 -> 0.30 (best at step 10); within max(10% x 0.30, 0.02) = 0.03 of it from step 6 (0.32)
    val = [2.0, 0.9, 0.32, 0.31, 0.30]
    # the base scores 0.60; the curve stays near it, then rises past 0.60 + max(5% x 0.6, 2 x noise, 0.02)
    general = [0.60, 0.61, 0.66, 0.80, 0.95]
    f = read_forgetting(_rows(val, general, base=0.60))
    assert f["fit_step"] == 6 and f["best_step"] == 10 and f["best_val_loss"] == 0.30
    assert f["fit_threshold"] == pytest.approx(max(FIT_REL * 0.30, MIN_LOSS_CHANGE))
    assert f["start_step"] == 0 and f["general_val_loss_start"] == 0.60
    assert f["general_val_loss_end"] == 0.95 and f["end_step"] == 10
    assert f["change"] == pytest.approx(0.35) and f["general_val_loss_at_best"] == 0.95
    assert f["drift_threshold"] >= max(DRIFT_REL * 0.60, MIN_LOSS_CHANGE)
    assert f["drift_step"] == 6  # 0.66 - 0.60 = 0.06 > the threshold; 0.61 was not
    assert f["evaluations"] == 5
    assert f["message"].startswith("The team's replies fit from step 6")
    assert "general answers drift from step 6" in f["message"] and "+0.350" in f["message"]


def test_held_when_the_curve_stays_within_its_threshold():
    f = read_forgetting(_rows([1.0, 0.5, 0.4], [0.80, 0.81, 0.805], base=0.80))
    assert f["drift_step"] is None and "general answers held within" in f["message"]


def test_without_the_base_value_the_first_evaluation_is_the_start():
    f = read_forgetting(_rows([1.0, 0.5, 0.4], [0.70, 0.90, 1.10]))
    assert f["start_step"] == 2 and f["general_val_loss_start"] == 0.70 and f["change"] == pytest.approx(0.40)
    assert "(step 2's)" in f["message"]


def test_without_team_validation_the_curve_is_still_read():
    f = read_forgetting(_rows([None, None, None], [0.5, 0.6, 0.9], base=0.5))
    # the jumpy curve sets its own threshold: 2 x noise = 0.15, so the rise of 0.1 at step 4 is not yet drift
    assert f["drift_threshold"] == pytest.approx(0.15) and f["drift_step"] == 6
    assert f["fit_step"] is None and "no team validation" in f["message"]


def test_a_resumed_run_reads_each_step_once():
    rows = _rows([1.0, 0.5, 0.4], [0.5, 0.6, 0.7], base=0.5)
    again = [dict(r) for r in rows if r["step"] >= 3]  # steps 3-6 taken again after a resume: later rows win
    again[-1]["general_val_loss"] = 0.65
    f = read_forgetting(rows + again)
    assert f["evaluations"] == 3 and f["general_val_loss_end"] == 0.65


losses = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(losses, losses), min_size=1, max_size=15),
    st.one_of(st.none(), losses),
)
def test_the_numbers_agree_with_the_rows(curves, base):
    val, general = [v for v, _ in curves], [g for _, g in curves]
    f = read_forgetting(_rows(val, general, base=base))
    steps = [2 * (k + 1) for k in range(len(curves))]
    start = base if base is not None else general[0]
    assert f["general_val_loss_start"] == start and f["general_val_loss_end"] == general[-1]
    assert f["change"] == pytest.approx(general[-1] - start) and f["evaluations"] == len(curves)
    # drift: the first evaluation above start + threshold, and none before it
    over = [s for s, g in zip(steps, general, strict=True) if g - start > f["drift_threshold"]]
    assert f["drift_step"] == (over[0] if over else None)
    assert f["drift_threshold"] >= max(DRIFT_REL * start, MIN_LOSS_CHANGE)
    # fit: the first evaluation within the threshold of the best, which is the earliest lowest validation loss
    best = min(val)
    assert f["best_val_loss"] == best and f["best_step"] == steps[val.index(best)]
    within = [s for s, v in zip(steps, val, strict=True) if v - best <= f["fit_threshold"]]
    assert f["fit_step"] == within[0] <= f["best_step"]
    assert f["general_val_loss_at_best"] == general[val.index(best)]


def test_the_summary_prints_both_curves_in_one_line():
    f = read_forgetting(_rows([2.0, 0.9, 0.32, 0.31, 0.30], [0.60, 0.61, 0.66, 0.80, 0.95], base=0.60))
    report = {
        "steps_taken": 10, "steps_planned": 10, "epochs_completed": 1.0, "first_train_loss": 2.0,
        "final_train_loss": 1.9, "best_val_loss": 0.30, "best_step": 10, "final_val_loss": 0.30,
        "tokens_processed": 100, "tokens_match": True, "wall_time_s": 3.0, "final_weights": "/tmp/run/adapter",
        "final_is_best": True, "diagnosis": {"kind": "good_fit", "message": "fine", "next_step": "none"},
        "reminder": "loss is not quality", "forgetting": f,
    }  # fmt: skip
    console = Console(file=io.StringIO(), width=400)
    print_summary(report, console)
    text = console.file.getvalue()
    assert "The team's replies fit from step 6" in text and "general answers drift from step 6" in text
    del report["forgetting"]
    console = Console(file=io.StringIO(), width=400)
    print_summary(report, console)
    assert "general answers" not in console.file.getvalue()
