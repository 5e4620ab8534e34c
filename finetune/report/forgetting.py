"""What the forgetting curve shows: from which step the team's replies fit, and from which general answers drift.

    section = read_forgetting(read_metrics("OUT/metrics.jsonl"))   # report.json's `forgetting`; None without a curve

The rows are metrics.jsonl's. A run with the forgetting curve on (`general_val`) logs `general_val_loss` at each
evaluation (the loss on held-out general prompts answered by the base model) and `general_val_loss_base` in step 1's
row (the same loss of the starting model, measured before the first step: the base itself). Definitions
(docs/report.md, "Forgetting"):

    start           general_val_loss_base when logged (step 0), else the first evaluation's general_val_loss
    drift threshold max(5% of start, 2 x noise of the general curve, 0.02 nats)    (noise as the diagnosis reads it)
    drift_step      the first evaluation whose general_val_loss is above start + drift threshold
    fit threshold   max(10% of the best val_loss, 0.02 nats)
    fit_step        the first evaluation whose val_loss is within the fit threshold of the best val_loss

0.02 nats per token is the change the diagnosis already takes as the least worth a sentence (MIN_LOSS_CHANGE).
"""

from __future__ import annotations

import math

from finetune.report.diagnosis import MIN_LOSS_CHANGE, NOISE_K, _noise

DRIFT_REL = 0.05  # of the starting general loss
FIT_REL = 0.10  # of the best validation loss
BASE_KEY, CURVE_KEY = "general_val_loss_base", "general_val_loss"


def read_forgetting(rows: list[dict]) -> dict | None:
    """report.json's `forgetting` section (module docstring), or None when the rows hold no general loss."""
    by_step: dict[int, dict] = {}
    for row in rows:  # later rows win for a repeated step (a resumed run)
        by_step.setdefault(int(row["step"]), {}).update(row)
    ordered = [by_step[s] for s in sorted(by_step)]
    general = [(r["step"], float(r[CURVE_KEY])) for r in ordered if _finite(r.get(CURVE_KEY))]
    if not general:
        return None
    val = [(r["step"], float(r["val_loss"])) for r in ordered if _finite(r.get("val_loss"))]
    base = next((float(r[BASE_KEY]) for r in ordered if _finite(r.get(BASE_KEY))), None)
    start_step, start = (0, base) if base is not None else general[0]
    values = [start, *(v for s, v in general if s != start_step)]
    drift_threshold = max(DRIFT_REL * start, NOISE_K * _noise(values), MIN_LOSS_CHANGE)
    drift_step = next((s for s, v in general if v - start > drift_threshold), None)
    (end_step, end), section = general[-1], {}
    if val:
        best_step, best = min(val, key=lambda sv: sv[1])  # the earliest of equal minima
        fit_threshold = max(FIT_REL * best, MIN_LOSS_CHANGE)
        section = {
            "fit_step": next(s for s, v in val if v - best <= fit_threshold),
            "fit_threshold": fit_threshold,
            "best_step": best_step,
            "best_val_loss": best,
            "general_val_loss_at_best": dict(general).get(best_step),
        }
    section = {"fit_step": None, **section, "drift_step": drift_step, "drift_threshold": drift_threshold}
    section |= {"general_val_loss_start": start, "start_step": start_step, "general_val_loss_end": end}
    section |= {"end_step": end_step, "change": end - start, "evaluations": len(general)}
    section["message"] = _message(section)
    return section


def _message(f: dict) -> str:
    """One sentence per curve: "the team's replies fit from step N; general answers drift from step M"."""
    if f["fit_step"] is not None:
        team = (
            f"The team's replies fit from step {f['fit_step']} (validation loss within {f['fit_threshold']:.3f} of "
            f"its best, {f['best_val_loss']:.3f} at step {f['best_step']})"
        )
    else:
        team = "The run had no team validation set, so no fit step"
    start = "the base model's" if f["start_step"] == 0 else f"step {f['start_step']}'s"
    moved = (
        f"general loss {f['general_val_loss_start']:.3f} ({start}) -> {f['general_val_loss_end']:.3f} at step "
        f"{f['end_step']}, {f['change']:+.3f} nats per token"
    )
    if f["drift_step"] is not None:
        general = f"general answers drift from step {f['drift_step']} ({moved})"
    else:
        general = f"general answers held within {f['drift_threshold']:.3f} of the start ({moved})"
    return f"{team}; {general}."


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
