"""build_report: the report.json content, tolerant plan lookups, tokens_match; print_summary renders it."""

import io
import json

import pytest
from rich.console import Console

from finetune.plan.build import build_plan
from finetune.plan.what_if import what_if_summary
from finetune.report.diagnosis import Diagnosis
from finetune.report.summary import build_report, print_summary, write_report
from finetune.settings.config import RunConfig

ROWS = [
    {"step": 1, "epoch": 0.5, "learning_rate": 1e-4, "train_loss": 2.5},
    {"step": 2, "epoch": 1.0, "learning_rate": 1e-4, "train_loss": 2.0, "val_loss": 2.1},
    {"step": 3, "epoch": 1.5, "learning_rate": 1e-4, "train_loss": 1.6},
    {"step": 4, "epoch": 2.0, "learning_rate": 1e-4, "train_loss": 1.4, "val_loss": 2.3},
]
DIAG = Diagnosis("too_short", "Only 4 training step(s) logged.", "Train for more steps.")


def _plan(tokens: int | None = 5000, price: float | None = 2.0):
    """A plan of 4 steps over `tokens` tokens (what-if: 8 records, batch 4, 2 epochs)."""
    config = RunConfig(epochs=2, batch_size=4, val_fraction=0, price_per_million_tokens=price, gpu="cpu")
    return build_plan(config, what_if_summary(config, 8, None if tokens is None else tokens // 2))


PLAN = _plan()


def build(plan=PLAN, tokens=5000, **kw):
    args = {"wall_time_s": 90.5, "final_weights": "runs/one/adapter", "final_is_best": False} | kw
    return build_report(ROWS, plan, DIAG, tokens_processed=tokens, **args)


def test_report_fields():
    r = build()
    assert (r["steps_taken"], r["steps_planned"], r["steps_match"]) == (4, 4, True)
    assert (r["first_train_loss"], r["final_train_loss"]) == (2.5, 1.4)
    assert (r["best_val_loss"], r["best_step"], r["final_val_loss"]) == (2.1, 2, 2.3)
    assert r["epochs_completed"] == 2.0
    assert r["diagnosis"] == {
        "kind": "too_short",
        "message": DIAG.message,
        "next_step": DIAG.next_step,
        "overfit_from_step": None,
    }
    assert r["estimated_time_s"] == PLAN.cost.seconds and r["wall_time_s"] == 90.5
    assert r["cost"] == pytest.approx(5000 / 1e6 * 2.0)
    assert r["final_weights"] == "runs/one/adapter" and r["final_is_best"] is False
    assert "finetune eval" in r["reminder"]
    json.dumps(r)  # serialisable as is


def test_tokens_match():
    assert build(tokens=5000)["tokens_match"] is True
    r = build(tokens=4999)
    assert r["tokens_match"] is False and (r["tokens_processed"], r["tokens_planned"]) == (4999, 5000)
    assert build(plan=_plan(tokens=None))["tokens_match"] is None  # nothing to compare with
    assert build(plan=_plan(price=None))["cost"] is None


def test_extra_is_merged_but_cannot_replace_report_keys():
    assert build(extra={"out_dir": "runs/one"})["out_dir"] == "runs/one"
    with pytest.raises(ValueError, match="tokens_match"):
        build(extra={"tokens_match": True})


def test_write_and_print(tmp_path):
    r = build(tokens=4999, extra={"out_dir": "runs/[one]"}) | {"estimated_time_s": 100.0}
    path = write_report(r, tmp_path / "report.json")
    assert json.loads(path.read_text()) == r
    buf = io.StringIO()
    print_summary(r, console=Console(file=buf, width=120, color_system=None))
    text = buf.getvalue()
    for expected in (
        "4 of 4 planned",
        "2.5000 -> 1.4000",
        "best 2.1000 at step 2",
        "mismatch",
        "1m 30s (estimated 1m 40s)",
        "0.01",
        "runs/[one]",
        "not the best checkpoint",
        "too short",
        "Train for more steps",
        "finetune eval",
    ):
        assert expected in text, expected
