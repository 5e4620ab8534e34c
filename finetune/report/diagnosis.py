"""Read the loss curves of a run and say what they show: overfitting, underfitting or a good fit.

    from finetune.report.diagnosis import diagnose
    d = diagnose(read_metrics("OUT/metrics.jsonl"), steps_per_epoch=100)
    print(d.kind, d.message, d.next_step)

Inputs are the rows of `metrics.jsonl` (`step`, `train_loss`, and `val_loss` on evaluation steps).
Training loss is noisy per step, so it is compared through means over a window of
h = max(2, n_train // 20) steps on each side ("smoothed"): every smoothed value is a mean of the same 2h + 1 steps
(a window near either end is moved inward, never cut short), so a low, an end and a value around a step are
comparable, and "the end" is the last of them. Validation loss is measured on the
whole validation set, so its points are compared directly, against a tolerance

    tol = max(2% of the best validation loss, 2 x noise, 0.001),   noise = median |v[i] - (v[i-1] + v[i+1]) / 2|

(0.001 nats, the last digit a message prints: at a best of 0, a rise of 1e-239 was "measurably worse").

The rules, checked in this order (first match wins):

1. too_short: fewer than 8 training steps.
2. unstable: a non-finite loss, a training loss more than 10x its running mean (a spike,
   report/stability.py), or smoothed training loss ending more than 10% (and more than 0.02) above
   its lowest smoothed value (the learning rate is likely too high).
3. no_validation: no validation points; the message still reads the training curve
   ("still falling" = smoothed train loss dropped more than 2% over the last quarter of the run).
   too_short: only 1-2 validation points.
4. After the best (lowest) validation loss, validation rose: the last point is more than `tol` above the best.
   - if the smoothed training loss at the end is not more than 2% above its value around the best step
     -> overfitting, best_step = the best evaluation step, overfit_from_step = the first evaluation
        after it that is more than `tol` above the best;
   - otherwise both curves rose -> unstable.
5. underfitting, still falling: the last 3 validation points improved by more than `tol` and the
   smoothed training loss at the end is more than 1% below its value at the first of those points.
6. underfitting, both high: the smoothed training loss at the end is less than 10% below its start
   (mean of the first 3 steps).
7. good_fit: validation flattened within `tol` of its minimum; a train/val gap above 25% of the
   training loss (and above 0.02) is mentioned (more or more varied data would help).

Loss is not answer quality: every diagnosis carries that reminder (`Diagnosis.reminder`).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from dataclasses import asdict, dataclass

from finetune.report.stability import SPIKE_FACTOR, find_spikes
from finetune.settings.wording import act

KINDS = ("overfitting", "underfitting", "good_fit", "no_validation", "too_short", "unstable")

REMINDER = (
    "Loss measures how well the model predicts your team's replies, not whether the answers are right: "
    f"read some answers ({act('evaluate')}) before shipping."
)

MIN_TRAIN_STEPS = 8
MIN_VAL_POINTS = 3
REL_TOL = 0.02  # validation changes below 2% of its best are not meaningful
NOISE_K = 2.0
VAL_ABS_TOL = 0.001  # nats: a validation change below the last printed digit is not measurable
RECENT_VAL_POINTS = 3  # "the last few" validation points
TRAIN_FALL_TOL = 0.01  # train loss "still going down" if the smoothed end is >1% below
TRAIN_RISE_TOL = 0.02  # train loss "kept falling" after the best step unless it rose >2%
TAIL_FALL_TOL = 0.02  # without validation: still falling if >2% drop over the last quarter
HIGH_LOSS_DROP = 0.10  # "both high": train loss dropped less than 10% from its start
UNSTABLE_RISE = 0.10  # smoothed train loss ending >10% above its low
LARGE_GAP = 0.25  # val above train by >25% of train: worth saying
# The relative rules above also need a change of at least this much: near zero loss, 10% or 25% is batch-to-batch
# noise (the SmolLM2 demo at Auto's rate: train 0.013 -> 0.014 at the end, validation 0.018 and still at its best).
MIN_LOSS_CHANGE = 0.02  # nats per scored token


@dataclass(frozen=True)
class Diagnosis:
    """What the loss curves of one run show, and what to try next."""

    kind: str
    """One of KINDS."""
    message: str
    """What the curves show, with numbers."""
    next_step: str
    """The concrete next thing to try."""
    best_step: int | None = None
    """Step with the lowest validation loss (None without validation)."""
    best_val_loss: float | None = None
    overfit_from_step: int | None = None
    """First evaluation after the best one where validation loss is measurably above the best."""
    reminder: str = REMINDER

    def to_dict(self) -> dict:
        return asdict(self)


class _Curves:
    """The train and validation series of a run, sorted by step, with windowed means of the train loss."""

    def __init__(self, train: list[tuple[int, float]], val: list[tuple[int, float]], lrs: list[float]):
        self.train_steps = [s for s, _ in train]
        self.train = [v for _, v in train]
        self.val_steps = [s for s, _ in val]
        self.val = [v for _, v in val]
        self.lrs = lrs
        self.half_window = max(2, len(self.train) // 20)
        self._prefix = [0.0]  # prefix sums make every windowed mean O(1)
        for v in self.train:
            self._prefix.append(self._prefix[-1] + v)

    def _mean(self, lo: int, hi: int) -> float:
        lo, hi = max(0, lo), min(len(self.train), hi)
        return (self._prefix[hi] - self._prefix[lo]) / (hi - lo)

    def centre(self, i: int) -> int:
        """The index the window of `i` is centred on: moved inward near either end, so that every window holds
        the same 2h + 1 steps (a half window at the last step, compared with a whole one, made a falling end a
        "low" below "the end")."""
        return max(min(i, len(self.train) - 1 - self.half_window), min(self.half_window, len(self.train) - 1))

    def smoothed_index(self, i: int) -> float:
        c = self.centre(i)
        return self._mean(c - self.half_window, c + self.half_window + 1)

    def smoothed_at(self, step: int) -> float:
        """Mean training loss over the window of steps around `step`."""
        return self.smoothed_index(min(bisect_left(self.train_steps, step), len(self.train) - 1))

    def smoothed_end(self) -> float:
        return self.smoothed_index(len(self.train) - 1)

    def lowest(self) -> tuple[float, int]:
        """The lowest smoothed value and the index of its window's centre (the earliest of equal ones)."""
        centres = range(self.centre(0), self.centre(len(self.train) - 1) + 1)
        return min((self.smoothed_index(i), i) for i in centres)

    def start(self) -> float:
        return self._mean(0, 3)


def diagnose(rows: list[dict], steps_per_epoch: int) -> Diagnosis:
    """Diagnose a run from its metric rows (see the module docstring for the rules)."""
    c = _curves(rows)
    spe = max(1, steps_per_epoch)
    n_train, n_val = len(c.train), len(c.val)

    if n_train < MIN_TRAIN_STEPS:
        return Diagnosis(
            "too_short",
            f"Only {n_train} training step(s) logged: too few to read a trend.",
            f"Train for more steps (at least {MIN_TRAIN_STEPS}; one epoch here is {spe} steps) to get a diagnosis.",
        )

    unstable = _check_unstable(c)
    if unstable is not None:
        return unstable

    if n_val == 0:
        return _diagnose_train_only(c, spe)

    if n_val < MIN_VAL_POINTS:
        return Diagnosis(
            "too_short",
            f"Only {n_val} validation point(s): too few to tell over- from underfitting. {_train_trend(c)}",
            f"Evaluate more often (e.g. every {max(1, spe // 4)} steps, 4 times per epoch) or train longer.",
        )

    return _diagnose_with_validation(c, spe)


# ---- the rules


def _check_unstable(c: _Curves) -> Diagnosis | None:
    lower_lr = f"lower the learning rate{_lr_hint(c, factor=0.5)}"
    bad = [s for s, v in zip(c.train_steps, c.train, strict=True) if not math.isfinite(v)]
    bad += [s for s, v in zip(c.val_steps, c.val, strict=True) if not math.isfinite(v)]
    if bad:
        return Diagnosis(
            "unstable",
            f"The loss became non-finite (NaN/inf) at step {min(bad)}: training diverged.",
            f"{_cap(lower_lr)} and keep warmup on; check the data for empty or huge records.",
        )
    spikes = find_spikes(c.train)
    if spikes:
        first = spikes[0]
        return Diagnosis(
            "unstable",
            f"The training loss spiked to {c.train[first]:.3f} at step {c.train_steps[first]}, more than "
            f"{SPIKE_FACTOR:g}x its running mean ({len(spikes)} spike(s) in all): the updates are too large "
            "or some records are very unlike the rest.",
            f"{_cap(lower_lr)}; check the records of the spiking steps for outliers.",
        )
    low, low_i = c.lowest()  # the same window as the end's: the end is the last of them, so low <= end
    end = c.smoothed_end()
    if end > low * (1 + UNSTABLE_RISE) and end - low > MIN_LOSS_CHANGE:  # so the low is an earlier window
        shown_low, shown_end = _two(low, end)
        return Diagnosis(
            "unstable",
            f"Training loss rose from its low of {shown_low} (around step {c.train_steps[low_i]}) to {shown_end} "
            f"at the end ({_change(low, end)}): the updates are too large.",
            f"{_cap(lower_lr)}; a longer warmup also helps.",
        )
    return None


def _diagnose_train_only(c: _Curves, spe: int) -> Diagnosis:
    start, end = c.start(), c.smoothed_end()
    if _tail_still_falling(c):
        epochs = _epochs(c, spe)
        advice = f"Train longer (e.g. {epochs + 1} epochs instead of {epochs}): the training loss was still falling."
    elif end > start * (1 - HIGH_LOSS_DROP):
        advice = f"Raise the learning rate{_lr_hint(c)}: the training loss barely moved."
    else:
        advice = "The training loss has flattened."
    return Diagnosis(
        "no_validation",
        f"Validation was off, so over- or underfitting cannot be told apart. {_train_trend(c)}",
        f"{advice} Turn validation on (hold out ~10% of the conversations) to see how the model does on new ones.",
    )


def _diagnose_with_validation(c: _Curves, spe: int) -> Diagnosis:
    best_val = min(c.val)
    best_i = c.val.index(best_val)  # earliest of equal minima
    best_step = c.val_steps[best_i]
    last_val, last_step = c.val[-1], c.val_steps[-1]
    tol = max(REL_TOL * best_val, NOISE_K * _noise(c.val), VAL_ABS_TOL)
    train_end = c.smoothed_end()
    found = {"best_step": best_step, "best_val_loss": best_val}

    # ---- validation rose after its best
    if last_val - best_val > tol:
        train_at_best = c.smoothed_at(best_step)
        shown_best, shown_last = _two(best_val, last_val)
        rise = (
            f"Validation loss reached its best {shown_best} at step {best_step}, "
            f"then rose to {shown_last} at step {last_step} ({_change(best_val, last_val)})"
        )
        train_then, train_now = _two(train_at_best, train_end)
        if train_end > train_at_best * (1 + TRAIN_RISE_TOL):
            return Diagnosis(
                "unstable",
                f"{rise}, and training loss rose too ({train_then} -> {train_now}): training became unstable.",
                f"Lower the learning rate{_lr_hint(c, factor=0.5)}, or keep the best checkpoint (step {best_step}).",
                **found,
            )
        from_step = next(s for s, v in zip(c.val_steps[best_i:], c.val[best_i:], strict=True) if v - best_val > tol)
        best_epochs, epochs = math.ceil(best_step / spe), _epochs(c, spe)
        trend = "kept falling" if train_end < train_at_best else "stayed level"  # not up by more than 2%
        keep = f"keep the best checkpoint (step {best_step}) rather than the last"
        if best_epochs < epochs:
            keep = f"train for {best_epochs} epoch(s) instead of {epochs}, or {keep}"
        return Diagnosis(
            "overfitting",
            f"{rise}, while training loss {trend} ({train_then} -> {train_now}): the model is memorizing the "
            f"training conversations; validation is measurably worse from step {from_step}.",
            f"{_cap(keep)}; more (or more varied) training data would help most.",
            overfit_from_step=from_step,
            **found,
        )

    # ---- validation ended near its best: still falling, stuck high, or flattened
    k = min(RECENT_VAL_POINTS, len(c.val))
    recent_gain = c.val[-k] - last_val
    train_then = c.smoothed_at(c.val_steps[-k])
    if recent_gain > tol and train_end < train_then * (1 - TRAIN_FALL_TOL):
        epochs = _epochs(c, spe)
        (val_then, val_now), (then, now) = _two(c.val[-k], last_val), _two(train_then, train_end)
        return Diagnosis(
            "underfitting",
            f"Both losses were still falling at the end: validation {val_then} -> {val_now} over the last "
            f"{k} evaluations (steps {c.val_steps[-k]}-{last_step}), training {then} -> {now}.",
            f"Train longer ({epochs + 1} or more epochs instead of {epochs}), or raise the learning rate{_lr_hint(c)}.",
            **found,
        )

    start = c.start()
    if train_end > start * (1 - HIGH_LOSS_DROP):
        return Diagnosis(
            "underfitting",
            f"Both losses stayed high: training loss went only from {start:.3f} to {train_end:.3f} "
            f"({_change(start, train_end)}), best validation loss {best_val:.3f}.",
            f"Raise the learning rate{_lr_hint(c)} or train longer; for LoRA a higher rank also adds capacity.",
            **found,
        )

    gap = last_val - train_end
    message = (
        f"Validation loss flattened near its best ({best_val:.3f} at step {best_step}; last {last_val:.3f}); "
        f"training loss {train_end:.3f}, gap {gap:+.3f}."
    )
    if gap > LARGE_GAP * train_end and gap > MIN_LOSS_CHANGE:
        message += " The gap is large: the model fits the training conversations much better than new ones."
        next_step = "Training needs no change; more (or more varied) data is what would close the gap."
    else:
        next_step = f"Training needs no change; read the answers ({act('evaluate')}) to judge quality."
    return Diagnosis("good_fit", message, next_step, **found)


# ---- helpers


def _curves(rows: list[dict]) -> _Curves:
    # Later rows win for a repeated step (a resumed run, or a separate evaluation row).
    by_step: dict[int, dict] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), {}).update(row)
    ordered = [by_step[s] for s in sorted(by_step)]
    return _Curves(
        train=[(r["step"], float(r["train_loss"])) for r in ordered if r.get("train_loss") is not None],
        val=[(r["step"], float(r["val_loss"])) for r in ordered if r.get("val_loss") is not None],
        lrs=[float(r["learning_rate"]) for r in ordered if r.get("learning_rate") is not None],
    )


def _noise(values: list[float]) -> float:
    """Point-to-point jitter: how far each point sits from the mean of its neighbours (median)."""
    if len(values) < 3:
        return 0.0
    return statistics.median(abs(values[i] - (values[i - 1] + values[i + 1]) / 2) for i in range(1, len(values) - 1))


def _tail_still_falling(c: _Curves) -> bool:
    quarter_step = c.train_steps[(3 * len(c.train)) // 4]
    return c.smoothed_end() < c.smoothed_at(quarter_step) * (1 - TAIL_FALL_TOL)


def _train_trend(c: _Curves) -> str:
    start, end = c.start(), c.smoothed_end()
    trend = "was still falling at the end" if _tail_still_falling(c) else "had flattened by the end"
    return f"Training loss went from {start:.3f} to {end:.3f} ({_change(start, end)}) and {trend}."


def _epochs(c: _Curves, spe: int) -> int:
    return max(1, math.ceil(c.train_steps[-1] / spe - 1e-9))


def _lr_hint(c: _Curves, factor: float = 2.0) -> str:
    if not c.lrs or max(c.lrs) <= 0:
        return ""
    peak = max(c.lrs)
    return f" (peak {_sci(peak)} -> {_sci(peak * factor)})"


def _sci(x: float) -> str:
    """Learning rates the way people write them: 2e-4, 1.5e-5."""
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _two(old: float, new: float) -> tuple[str, str]:
    """Two losses with 3 decimals, or as many more as it takes (up to 6) for different values to read differently:
    a sentence saying one rose or fell from the other must not print two equal numbers."""
    for digits in range(3, 7):
        shown = f"{old:.{digits}f}", f"{new:.{digits}f}"
        if shown[0] != shown[1] or old == new:
            break
    return shown


def _change(old: float, new: float) -> str:
    """Relative change as '+12%' / '-40%' (a loss of exactly 0 would divide by zero)."""
    if old == 0:
        return "n/a"
    return f"{100 * (new / old - 1):+.0f}%"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]
