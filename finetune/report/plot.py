"""The loss-curve picture of a run: `OUT/loss_curve.png`.

    plot_loss_curve(read_metrics("OUT/metrics.jsonl"), "OUT/loss_curve.png", steps_per_epoch=100, best_step=120)

Training loss per step (thin) and smoothed (bold), validation loss (markers), dashed lines at epoch
boundaries, a star on the best validation step; with the forgetting curve on (general_val), the loss on general
answers of the base beside them (green squares, from the base model's own value, dotted, at step 0).
matplotlib is imported inside the function, and the figure is drawn on its own Agg canvas (no pyplot global
state), so it can be called from any thread.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from finetune.report.preference import plot_preference

TRAIN_COLOR = "#1f77b4"
VAL_COLOR = "#d62728"
GENERAL_COLOR = "#2ca02c"  # the forgetting curve: loss on general answers of the base
BEST_COLOR = "#ffbf00"
MAX_EPOCH_LABELS = 12  # beyond this the labels would overlap


def plot_loss_curve(
    rows: list[dict],
    path: str | os.PathLike,
    steps_per_epoch: int,
    best_step: int | None,
    title: str = "",
) -> Path:
    """Draw train and validation loss against steps to a PNG at `path` (written atomically); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train = [(r["step"], r["train_loss"]) for r in rows if r.get("train_loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    general, general_base = _general(rows)  # the forgetting curve (general_val): none without it

    preference = any(r.get("reward_margin") is not None for r in rows)  # a DPO run: margin and accuracy below
    fig = Figure(figsize=(9, 9 if preference else 5.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(2, 1, 1) if preference else fig.add_subplot()
    ax.set_title(title or "Loss curve")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("DPO loss (mean over pairs)" if preference else "loss (mean over target tokens)")
    ax.grid(True, alpha=0.3)

    if not train and not val:
        ax.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", transform=ax.transAxes)
    else:
        smooth = _plot_train(ax, train)
        _plot_val(ax, val)
        _plot_general(ax, general, general_base)
        last_step = max(s for s, _ in train + val)
        _mark_epochs(ax, steps_per_epoch, last_step)
        _mark_best(ax, val, best_step)
        _set_ylim(ax, smooth + [v for _, v in val + general] + ([general_base] if general_base is not None else []))
        ax.set_xlim(0, last_step * 1.02)
        # Below the axes: inside, it would cover the epoch labels or the start of the curves.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3 if general else 4, frameon=False)

    if preference:
        plot_preference(fig.add_subplot(2, 1, 2, sharex=ax), rows)

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, out)  # a reader may be reading the previous picture
    return out


def _plot_train(ax, train: list[tuple[int, float]]) -> list[float]:
    """Plot the train loss; returns the values the y-range should cover (smoothed, so step spikes do not squash it)."""
    if not train:
        return []
    steps, losses = [s for s, _ in train], [v for _, v in train]
    if len(train) < 20:
        ax.plot(steps, losses, color=TRAIN_COLOR, marker=".", lw=1.2, label="train loss")
        return losses
    finite = [(s, v) for s, v in train if math.isfinite(v)]
    smooth = _centred_mean([v for _, v in finite], half=max(2, len(finite) // 30))
    ax.plot(steps, losses, color=TRAIN_COLOR, lw=0.7, alpha=0.3, label="train loss (per step)")
    ax.plot([s for s, _ in finite], smooth, color=TRAIN_COLOR, lw=2.0, label="train loss (smoothed)")
    return smooth


def _plot_val(ax, val: list[tuple[int, float]]) -> None:
    if val:
        steps, losses = [s for s, _ in val], [v for _, v in val]
        ax.plot(steps, losses, color=VAL_COLOR, marker="o", ms=4, lw=1.5, label="validation loss")


def _mark_epochs(ax, steps_per_epoch: int, last_step: int) -> None:
    if steps_per_epoch <= 0:
        return
    n_epochs = math.ceil(last_step / steps_per_epoch)
    for k in range(1, n_epochs):
        ax.axvline(k * steps_per_epoch, color="0.45", ls="--", lw=1.0)
    if n_epochs > MAX_EPOCH_LABELS:
        return
    # One label per epoch, centred in its span, just under the top edge (x in data, y in axes coordinates).
    transform = ax.get_xaxis_transform()
    for k in range(n_epochs):
        centre = (k * steps_per_epoch + min((k + 1) * steps_per_epoch, last_step)) / 2
        ax.text(centre, 0.98, f"epoch {k + 1}", transform=transform, ha="center", va="top", color="0.35", fontsize=9)


def _mark_best(ax, val: list[tuple[int, float]], best_step: int | None) -> None:
    best = [v for s, v in val if s == best_step]
    if best_step is None or not best:
        return
    y = best[-1]
    ax.plot([best_step], [y], marker="*", ms=18, color=BEST_COLOR, mec="black", ls="none", zorder=5, label="best")
    ax.annotate(
        f"best: step {best_step}\nval loss {y:.3f}",
        xy=(best_step, y),
        xytext=(0, -38),
        textcoords="offset points",
        ha="center",
        fontsize=9,
        arrowprops={"arrowstyle": "-", "color": "0.3"},
        bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.6"},
    )


def _set_ylim(ax, values: list[float]) -> None:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return
    lo, hi = min(finite), max(finite)
    pad = max(0.05 * (hi - lo), 0.02 * abs(hi), 1e-3)
    ax.set_ylim(lo - 3 * pad, hi + 3 * pad)  # room for the epoch labels above and the best-step note below


def _centred_mean(values: list[float], half: int) -> list[float]:
    """Moving average centred on each point (no lag, unlike an EMA); the window shrinks symmetrically at the ends."""
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for i in range(len(values)):
        h = min(half, i, len(values) - 1 - i)
        out.append((prefix[i + h + 1] - prefix[i - h]) / (2 * h + 1))
    return out


def _general(rows: list[dict]) -> tuple[list[tuple[int, float]], float | None]:
    """The forgetting curve's points (general_val_loss by step) and the starting model's value (before step 1)."""
    general = [(r["step"], r["general_val_loss"]) for r in rows if r.get("general_val_loss") is not None]
    base = next((r["general_val_loss_base"] for r in rows if r.get("general_val_loss_base") is not None), None)
    return general, base


def _plot_general(ax, general: list[tuple[int, float]], base: float | None) -> None:
    """The second validation curve: loss on held-out general prompts answered by the base model, from the base's
    own value at step 0 (dotted: the level of no forgetting). Comparable across steps, not to the team's loss."""
    if base is not None:
        ax.axhline(base, color=GENERAL_COLOR, ls=":", lw=1.2, label="general answers: the base (no forgetting)")
    points = ([(0, base)] if base is not None else []) + general
    if general:
        steps, losses = [s for s, _ in points], [v for _, v in points]
        ax.plot(
            steps, losses, color=GENERAL_COLOR, marker="s", ms=4, lw=1.5, label="general answers (forgetting curve)"
        )
