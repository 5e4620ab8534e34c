"""What a preference (DPO) run's metrics show, and the margin/accuracy panel of its curve.

A healthy preference run: reward accuracy (the share of pairs where the tuned model moved toward the chosen
answer more than toward the rejected one) rises well above chance (0.5), the reward margin grows, and the
chosen answers' log-probabilities do not collapse (DPO can raise the margin by making both answers unlikely,
which makes the model worse at saying the chosen one). The numbers read are the validation ones when the run
evaluated (`val_reward_accuracy`, ...), else the training ones averaged over the first and last quarter.

Rules, first match wins:
1. too_short: fewer than 4 steps with preference metrics.
2. unstable: a non-finite loss or margin.
3. chosen_collapsing: chosen log-probability fell by more than COLLAPSE_NATS nats and by more than
   COLLAPSE_SHARE of its starting size.
4. preference_not_learning: reward accuracy ends below HEALTHY_ACCURACY, or the margin did not grow.
5. healthy_preference.
"""

from __future__ import annotations

import math

from finetune.report.diagnosis import Diagnosis
from finetune.settings.wording import act, ref

PREFERENCE_KINDS = ("healthy_preference", "preference_not_learning", "chosen_collapsing", "too_short", "unstable")
MIN_STEPS = 4
HEALTHY_ACCURACY = 0.65  # well above chance (0.5)
COLLAPSE_NATS = 2.0
COLLAPSE_SHARE = 0.5
REMINDER = (
    "Reward accuracy measures which of two answers the model prefers, not whether its own answers are good: "
    f"read some answers ({act('evaluate')}) before shipping."
)


def _series(rows: list[dict], name: str) -> list[float]:
    return [float(r[name]) for r in rows if r.get(name) is not None]


def _start_end(rows: list[dict], name: str) -> tuple[float, float, str]:
    """(start, end, where): validation points when there are 2+, else training means over a quarter of the run."""
    val = _series(rows, f"val_{name}")
    if len(val) >= 2:
        return val[0], val[-1], "validation"
    train = _series(rows, name)
    q = max(1, len(train) // 4)
    return sum(train[:q]) / q, sum(train[-q:]) / q, "training"


def diagnose_preference(rows: list[dict]) -> Diagnosis:
    steps = [r for r in rows if r.get("reward_accuracy") is not None]
    if len(steps) < MIN_STEPS:
        return Diagnosis(
            "too_short",
            f"only {len(steps)} step(s) with preference metrics: too few to read a trend",
            "train for more steps (more pairs or another epoch)",
            reminder=REMINDER,
        )
    values = _series(rows, "train_loss") + _series(rows, "reward_margin") + _series(rows, "val_loss")
    if not all(math.isfinite(v) for v in values):
        return Diagnosis(
            "unstable",
            "the loss or the reward margin became non-finite",
            f"lower {ref('lr')} or raise {ref('beta')}",
            reminder=REMINDER,
        )
    acc0, acc1, where = _start_end(rows, "reward_accuracy")
    margin0, margin1, _ = _start_end(rows, "reward_margin")
    chosen0, chosen1, _ = _start_end(rows, "chosen_logp")
    rejected0, rejected1, _ = _start_end(rows, "rejected_logp")
    numbers = (
        f"{where} reward accuracy {acc0:.2f} -> {acc1:.2f}, margin {margin0:.3f} -> {margin1:.3f}, chosen "
        f"log-probability {chosen0:.1f} -> {chosen1:.1f}, rejected {rejected0:.1f} -> {rejected1:.1f}"
    )
    best = {}
    val_loss = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    if val_loss:
        best_step, best_val = min(val_loss, key=lambda sv: sv[1])
        best = {"best_step": best_step, "best_val_loss": best_val}
    drop = chosen0 - chosen1
    if drop > COLLAPSE_NATS and drop > COLLAPSE_SHARE * abs(chosen0):
        return Diagnosis(
            "chosen_collapsing",
            f"{numbers}: the margin grows by making the chosen answers unlikely too, not by preferring them",
            f"lower {ref('lr')}, raise {ref('beta')}, or add {ref('sft_weight', 0.5)} to keep the chosen answers likely",
            reminder=REMINDER,
            **best,
        )
    if acc1 < HEALTHY_ACCURACY or margin1 <= margin0:
        return Diagnosis(
            "preference_not_learning",
            f"{numbers}: the model does not yet prefer the chosen answers well above chance (0.5)",
            f"train longer (another epoch) or with a higher {ref('lr')}; check that chosen and rejected differ in a "
            "consistent way",
            reminder=REMINDER,
            **best,
        )
    return Diagnosis(
        "healthy_preference",
        f"{numbers}: accuracy well above chance, margins growing, chosen answers not collapsing",
        f"read a few answers ({act('evaluate')}); if they overdo the preferred style, raise {ref('beta')}",
        reminder=REMINDER,
        **best,
    )


def preference_summary(rows: list[dict]) -> dict:
    """report.json's final preference numbers: the last evaluation's, else the last step's (empty for SFT)."""
    found = {}
    for name in ("reward_accuracy", "reward_margin", "chosen_logp", "rejected_logp"):
        for key in (f"val_{name}", name):
            values = _series(rows, key)
            if values:
                found[f"final_{key}"] = values[-1]
    return found


def plot_preference(ax, rows: list[dict]) -> None:
    """Reward margin (left axis) and reward accuracy (right axis, 0-1) against steps, train and validation."""
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward margin")
    ax.grid(True, alpha=0.3)
    accuracy_ax = ax.twinx()
    accuracy_ax.set_ylabel("reward accuracy")
    accuracy_ax.set_ylim(-0.02, 1.02)
    accuracy_ax.axhline(0.5, color="0.6", ls=":", lw=1.0)
    lines = []
    for prefix, marker, label in (("", None, "train"), ("val_", "o", "validation")):
        margin = [(r["step"], r[f"{prefix}reward_margin"]) for r in rows if r.get(f"{prefix}reward_margin") is not None]
        accuracy = [
            (r["step"], r[f"{prefix}reward_accuracy"]) for r in rows if r.get(f"{prefix}reward_accuracy") is not None
        ]
        if margin:
            lines += ax.plot(
                *zip(*margin, strict=True), color="tab:purple", marker=marker, ms=4, lw=1.2, label=f"{label} margin"
            )
        if accuracy:
            lines += accuracy_ax.plot(
                *zip(*accuracy, strict=True),
                color="tab:green",
                marker=marker,
                ms=4,
                lw=1.2,
                ls="--",
                label=f"{label} accuracy",
            )
    if lines:
        ax.legend(
            lines,
            [line.get_label() for line in lines],
            loc="upper center",
            bbox_to_anchor=(0.5, -0.18),
            ncol=4,
            frameon=False,
        )
