"""Adapter scale after training (WiSE-FT, base + scale x update): which scale Auto keeps, from measurements.

    choice = choose_scale(measured)         # measured: [{"alpha", "val_loss", "general_loss"}, ...]
    choice.value, choice.reason             # the scale to write into the adapter, and why

A LoRA adapter adds `(alpha / r) B A` to each weight it adapts; scaling it by s adds `s (alpha / r) B A`. At s = 1
the tuned model, at s = 0 the base. After training, Auto measures a few scales on the team's validation set (the
run's own validation loss) and on a general probe (the loss on held-out general prompts answered by the base
itself, never the retention check's set), and keeps the smallest scale whose validation loss stays within the
tolerance of the full adapter's: the team's fit kept, as little of the update as that takes. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from finetune.rules.auto import Choice

GRID = (0.25, 0.5, 0.75, 1.0)  # the scales Auto measures (1 is the adapter as trained)
REFERENCE = 0.0  # also measured, never chosen: the base itself (how far the adapter moved both losses)
PASSES = len(GRID) + 1  # forward passes over the validation records (and over the general probe)
# The fit kept: validation loss at most 10% above the full adapter's (the issue's own yardstick for Auto's fit:
# "within 10% of the sweep's best") and never less than 0.02 nats per token of room: near zero a 10% band is narrower
# than a seed moves it. 0.02 nats is the least change of a loss the report calls a change (diagnosis.MIN_LOSS_CHANGE),
# a 2% change in the probability of each of the team's tokens. It was 0.01 before SmolLM2 was measured: there only
# the full adapter was within 0.01 (0.018) and the run was flagged; 0.75 cost 0.016 nats, kept house style at 100%
# and was not flagged (bench/AUTO.md, "Retention").
RELATIVE_TOLERANCE = 0.10
ABSOLUTE_TOLERANCE = 0.02


NO_VALIDATION = "no validation set: the fit at a lower scale cannot be measured, so the adapter stays as trained (1)"
FULL_RUN = "full fine-tuning trains every weight: there is no adapter to scale (adapter scale applies to LoRA runs)"
PREFERENCE_RUN = (
    "preference tuning: Auto measures the scale on the team's supervised validation loss, which this run does not "
    "have; the adapter stays as trained (1)"
)


def tolerance(full_val_loss: float) -> float:
    """How far above the full adapter's validation loss a scale may go and still keep the fit."""
    return max(RELATIVE_TOLERANCE * full_val_loss, ABSOLUTE_TOLERANCE)


def choose_scale(measured: Sequence[dict]) -> Choice[float]:
    """The smallest scale of GRID whose val_loss is within `tolerance` of scale 1's; 1 when the general probe was
    measured and that scale does not lower its loss (scaling back would then cost fit and buy nothing)."""
    by_alpha = {float(m["alpha"]): m for m in measured}
    full = by_alpha.get(1.0)
    if full is None or full.get("val_loss") is None:
        return Choice(1.0, "no validation loss at scale 1 to compare with: the adapter as trained")
    limit = full["val_loss"] + tolerance(full["val_loss"])
    kept = [a for a in sorted(by_alpha) if a in GRID and by_alpha[a].get("val_loss") is not None]
    chosen = next(a for a in kept if by_alpha[a]["val_loss"] <= limit)  # 1 itself always qualifies
    rule = (
        f"the smallest of {_listed(GRID)} whose validation loss stays within {_band(full['val_loss'])} of the "
        f"full adapter's {full['val_loss']:.4g} (at most {limit:.4g})"
    )
    if chosen == 1.0:
        return Choice(1.0, f"{rule}: only the full adapter keeps the fit")
    general, general_full = by_alpha[chosen].get("general_loss"), full.get("general_loss")
    if general is not None and general_full is not None and general >= general_full:
        return Choice(
            1.0,
            f"{rule} is {chosen:g}, but it does not lower the loss on the general probe ({general:.4g} against "
            f"{general_full:.4g} at 1): the adapter as trained",
        )
    return Choice(chosen, f"{rule}: {chosen:g}")


def _band(full_val_loss: float) -> str:
    if RELATIVE_TOLERANCE * full_val_loss >= ABSOLUTE_TOLERANCE:
        return f"{RELATIVE_TOLERANCE:.0%}"
    return f"{ABSOLUTE_TOLERANCE:g} nats per token"


def _listed(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values)


def plan_reason(validation_records: int | None, validation_tokens: int | None, seconds: float | None) -> str:
    """What the plan says of `auto`: chosen after training, by what rule, at what cost (records None: unknown)."""
    if validation_records == 0:
        return NO_VALIDATION
    records = (
        "the validation records" if validation_records is None else f"the {validation_records:,} validation records"
    )
    cost = f"{PASSES} forward passes over {records}"
    if validation_tokens:
        cost += f" ({PASSES * validation_tokens:,} tokens)"
    cost += " and over the held-out general prompts the base answered (generated once per base, cached)"
    if seconds is not None:
        cost += f", about {seconds:.0f} s more"
    return (
        f"chosen after training: the smallest of {_listed(GRID)} whose validation loss stays within "
        f"{RELATIVE_TOLERANCE:.0%} (at least {ABSOLUTE_TOLERANCE:g} nats) of the full adapter's, unless it does not "
        f"lower the loss on held-out general prompts (docs/retention.md); costs {cost}, outside the tokens "
        "processed (not billed by tokens)"
    )
