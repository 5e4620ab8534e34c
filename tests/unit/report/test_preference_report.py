"""The diagnosis of a preference run, and the margin/accuracy panel of its curve."""

from __future__ import annotations

from finetune.report.plot import plot_loss_curve
from finetune.report.preference import diagnose_preference
from finetune.settings.wording import render


def _rows(accuracy, margin, chosen, val=True):
    rows = []
    for step, (a, m, c) in enumerate(zip(accuracy, margin, chosen, strict=True), 1):
        row = {"step": step, "train_loss": 0.69 - 0.01 * step, "reward_accuracy": a, "reward_margin": m}
        row |= {"chosen_logp": c, "rejected_logp": c - 5}
        if val and step % 2 == 0:
            row |= {"val_loss": 0.7 - 0.01 * step, "val_reward_accuracy": a, "val_reward_margin": m}
            row |= {"val_chosen_logp": c, "val_rejected_logp": c - 5 - m}
        rows.append(row)
    return rows


def test_a_healthy_run():
    d = diagnose_preference(_rows([0, 0.6, 0.7, 0.8, 0.9, 0.95], [0, 0.1, 0.2, 0.4, 0.6, 0.8], [-50] * 6))
    assert d.kind == "healthy_preference" and "0.60 -> 0.95" in d.message and d.best_step == 6


def test_collapsing_chosen_answers():
    d = diagnose_preference(_rows([0, 0.8, 0.9, 0.9, 0.9, 0.9], [0, 1, 2, 3, 4, 5], [-20, -25, -30, -40, -50, -60]))
    assert d.kind == "chosen_collapsing" and "--sft-weight 0.5" in render(d.next_step, "cli")


def test_not_learning_and_too_short():
    flat = diagnose_preference(_rows([0.5] * 8, [0.01] * 8, [-50] * 8, val=False))
    assert flat.kind == "preference_not_learning" and "training" in flat.message
    assert diagnose_preference(_rows([0.5] * 2, [0.0] * 2, [-5] * 2)).kind == "too_short"


def test_the_curve_shows_margin_and_accuracy(tmp_path):
    rows = _rows([0, 0.6, 0.7, 0.8], [0, 0.1, 0.2, 0.4], [-50] * 4)
    png = plot_loss_curve(rows, tmp_path / "curve.png", steps_per_epoch=2, best_step=4)
    plain = plot_loss_curve([{"step": 1, "train_loss": 1.0}], tmp_path / "plain.png", 2, None)
    from PIL import Image

    assert Image.open(png).size[1] > Image.open(plain).size[1]  # a second panel under the loss
