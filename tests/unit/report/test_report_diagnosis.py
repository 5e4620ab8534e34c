"""diagnose(): one synthetic run per diagnosis kind, with the numbers the rules key on."""

import math
import random

import pytest

from finetune.report.diagnosis import KINDS, REMINDER, diagnose
from finetune.settings.wording import render

SPE = 50  # steps per epoch in every synthetic run: 3 epochs = 150 steps


def make_rows(train, val=None, steps=150, eval_every=10, noise=0.02, lr=2e-4, seed=0):
    """Metric rows as the loop writes them: `train(step)` plus per-step noise, `val(step)` on evaluation steps."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "epoch": step / SPE, "learning_rate": lr, "train_loss": train(step) + rng.gauss(0, noise)}
        if val is not None and (step % eval_every == 0 or step % SPE == 0):
            row["val_loss"] = val(step)
        rows.append(row)
    return rows


def test_overfitting_names_best_step_and_from_step():
    # Validation bottoms out at step 70 (1.20) and climbs after; training keeps falling.
    rows = make_rows(train=lambda s: 0.5 + 2.0 * math.exp(-s / 40), val=lambda s: 1.2 + 1e-4 * (s - 70) ** 2)
    d = diagnose(rows, SPE)
    assert d.kind == "overfitting"
    assert d.best_step == 70
    assert d.best_val_loss == pytest.approx(1.2)
    # tol = max(2% x 1.2, 2 x 0.01 jitter) = 0.024: step 80 is +0.01, step 90 is +0.04.
    assert d.overfit_from_step == 90
    assert "step 70" in d.message and "step 90" in d.message
    assert "2 epoch(s) instead of 3" in d.next_step and "step 70" in d.next_step


def test_overfitting_survives_noisy_validation():
    rng = random.Random(1)
    rows = make_rows(
        train=lambda s: 0.5 + 2.0 * math.exp(-s / 40),
        val=lambda s: 1.2 + 1e-4 * (s - 70) ** 2 + rng.gauss(0, 0.005),
    )
    d = diagnose(rows, SPE)
    assert d.kind == "overfitting"
    assert 60 <= d.best_step <= 80
    assert d.overfit_from_step > d.best_step


def test_underfitting_when_both_still_falling():
    rows = make_rows(train=lambda s: 3.0 - s / 150, val=lambda s: 3.1 - 0.9 * s / 150)
    d = diagnose(rows, SPE)
    assert d.kind == "underfitting"
    assert "still falling" in d.message
    assert d.best_step == 150 and d.overfit_from_step is None
    assert "4 or more epochs instead of 3" in d.next_step
    assert "learning rate" in d.next_step and "2e-4 -> 4e-4" in d.next_step  # peak 2e-4 doubled


def test_underfitting_when_both_stay_high():
    # Flat curves that barely moved (-5%): the model has not learned much.
    rows = make_rows(
        train=lambda s: 1.9 + 0.1 * math.exp(-s / 20),
        val=lambda s: 2.0 + 0.05 * math.exp(-s / 20),
        noise=0.01,
    )
    d = diagnose(rows, SPE)
    assert d.kind == "underfitting"
    assert "stayed high" in d.message
    assert "learning rate" in d.next_step


def test_good_fit_when_validation_flattens_near_its_minimum():
    rows = make_rows(train=lambda s: 1.0 + 2.0 * math.exp(-s / 20), val=lambda s: 1.1 + 0.5 * math.exp(-s / 20))
    d = diagnose(rows, SPE)
    assert d.kind == "good_fit"
    assert d.best_val_loss == pytest.approx(min(r["val_loss"] for r in rows if "val_loss" in r))
    assert "gap is large" not in d.message


def test_good_fit_mentions_a_large_gap():
    rows = make_rows(train=lambda s: 0.5 + 2.0 * math.exp(-s / 20), val=lambda s: 1.1 + 0.5 * math.exp(-s / 20))
    d = diagnose(rows, SPE)
    assert d.kind == "good_fit"
    assert "gap is large" in d.message and "data" in d.next_step


def test_no_validation_reads_the_training_curve():
    falling = diagnose(make_rows(train=lambda s: 3.0 - s / 100), SPE)
    assert falling.kind == "no_validation"
    assert "Validation was off" in falling.message and "still falling" in falling.message
    assert "Train longer" in falling.next_step and falling.best_step is None

    flat = diagnose(make_rows(train=lambda s: 1.0 + 2.0 * math.exp(-s / 20)), SPE)
    assert flat.kind == "no_validation"
    assert "flattened" in flat.message
    assert "Turn validation on" in flat.next_step


def test_too_short():
    assert diagnose(make_rows(train=lambda s: 2.0, steps=4), SPE).kind == "too_short"
    assert diagnose([], SPE).kind == "too_short"
    # Enough steps but only two validation points (the two epoch ends).
    d = diagnose(make_rows(train=lambda s: 3.0 - s / 100, val=lambda s: 3.0, steps=100, eval_every=1000), SPE)
    assert d.kind == "too_short" and "Evaluate more often" in d.next_step


def test_unstable_when_loss_diverges():
    d = diagnose(make_rows(train=lambda s: 2.0 if s < 100 else 2.0 + (s - 100) / 20), SPE)
    assert d.kind == "unstable" and "Lower the learning rate" in d.next_step

    rows = make_rows(train=lambda s: 2.0 - s / 200)
    rows[120]["train_loss"] = float("nan")
    d = diagnose(rows, SPE)
    assert d.kind == "unstable" and "step 121" in d.message


def test_a_small_rise_near_zero_loss_is_noise_not_instability():
    # The SmolLM2 demo's shape: training loss down to ~0.012, its last steps 0.002 higher (+17%), validation at its best.
    rows = make_rows(
        train=lambda s: 0.012 + 2.0 * math.exp(-s / 10) + (0.002 if s > 140 else 0.0),
        val=lambda s: 0.018 + 1.0 * math.exp(-s / 10),
        noise=0.001,
    )
    d = diagnose(rows, SPE)
    assert d.kind == "good_fit" and "gap is large" not in d.message  # 0.006 is not a large gap either
    # The same +17% from a loss of 1.2 is a real rise.
    rows = make_rows(train=lambda s: 1.2 + 2.0 * math.exp(-s / 10) + (0.2 if s > 140 else 0.0), noise=0.001)
    assert diagnose(rows, SPE).kind == "unstable"


def test_every_diagnosis_carries_the_reminder_and_a_known_kind():
    d = diagnose(make_rows(train=lambda s: 3.0 - s / 100), SPE)
    assert d.kind in KINDS
    assert d.reminder == REMINDER and "finetune eval" in render(d.reminder, "cli")
    # an API caller and a dashboard reader cannot run a command: they are pointed at the evaluation route
    assert "finetune" not in render(d.reminder, "api") and "/evaluations" in render(d.reminder, "api")
    assert d.to_dict()["kind"] == d.kind


def test_repeated_steps_keep_the_latest_row():
    # A resumed run that did not truncate, or an evaluation logged as its own row, must not confuse the rules.
    rows = make_rows(train=lambda s: 0.5 + 2.0 * math.exp(-s / 40), val=lambda s: 1.2 + 1e-4 * (s - 70) ** 2)
    rows += [{"step": 70, "val_loss": 1.5}]
    d = diagnose(rows, SPE)
    assert d.best_step == 60
