"""The retention check's printout (finetune eval --retention, finetune demo) names settings as flags, never as the
placeholders a report carries for each reader (wording.py)."""

from __future__ import annotations

from finetune.commands.eval import print_retention
from finetune.ship.eval.retention import MEASURES, remedies


def _measure(dropped: bool) -> dict:
    rate = {"rate": 0.3, "low": 0.2, "high": 0.4}
    return {"n": 10, "base": rate, "tuned": rate, "change": {"value": -0.1, "low": -0.2, "high": -0.01},
            "dropped": dropped}  # fmt: skip


def test_remedies_print_as_flags(capsys):
    report = {key: _measure(key == "accuracy") for key in MEASURES}
    report |= {"kl": {"mean_per_token": 1.3}, "flag": True, "message": "Tuning cost the model some of what it knew.",
               "remedies": remedies("lora", head_trained=True), "file": "RUN/retention.json",
               "seconds": {"total": 3}}  # fmt: skip
    print_retention(report)
    printed = capsys.readouterr().out
    assert "--epochs" in printed and "--lr" in printed and "--lora-rank" in printed
    assert "⦃" not in printed and "⦄" not in printed
