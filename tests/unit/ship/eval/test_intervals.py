"""95% intervals: Wilson for a rate, Newcombe's paired interval for the change between two models."""

from __future__ import annotations

import numpy as np
import pytest

from finetune.ship.eval.intervals import paired_difference, wilson


def test_wilson_matches_the_textbook_values():
    assert wilson(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)  # z^2 / (n + z^2)
    assert wilson(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    assert wilson(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-5)
    assert wilson(0, 0) == (0.0, 1.0)


def test_identical_outcomes_give_no_change_and_an_interval_around_zero():
    outcomes = [True] * 30 + [False] * 70
    change = paired_difference(outcomes, outcomes)
    assert change["value"] == 0 and change["gained"] == change["lost"] == 0
    assert change["low"] < 0 < change["high"] and change["high"] - change["low"] < 0.1


def test_swapping_the_models_mirrors_the_interval():
    rng = np.random.default_rng(0)
    base, tuned = list(rng.random(80) < 0.6), list(rng.random(80) < 0.4)
    forward, backward = paired_difference(base, tuned), paired_difference(tuned, base)
    assert backward["value"] == pytest.approx(-forward["value"])
    assert (backward["low"], backward["high"]) == pytest.approx((-forward["high"], -forward["low"]))


def test_a_clear_loss_lies_below_zero_and_a_small_one_does_not():
    base = [True] * 60 + [False] * 40
    assert paired_difference(base, [False] * 100)["high"] < 0
    assert paired_difference(base, [False] + base[1:])["high"] > 0  # one prompt lost out of 100: chance


def test_the_paired_interval_covers_the_true_change_95_percent_of_the_time():
    # base right with p 0.6; the tuned model keeps the base's outcome 80% of the time, else is right with p 0.4
    rng = np.random.default_rng(1)
    true_change = (0.8 * 0.6 + 0.2 * 0.4) - 0.6
    covered = 0
    reps = 2000
    for _ in range(reps):
        base = rng.random(100) < 0.6
        tuned = np.where(rng.random(100) < 0.8, base, rng.random(100) < 0.4)
        change = paired_difference(list(base), list(tuned))
        covered += change["low"] <= true_change <= change["high"]
    assert 0.93 <= covered / reps <= 0.975
