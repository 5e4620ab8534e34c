"""The retention check's verdict: each rate of both models, its paired change and its test, and one flag for the
whole check (issue 47: Holm's correction across its measures, family.py).

    numbers = measure(base_ok, tuned_ok)                       # a rate: Wilson per side, Newcombe's change, p
    numbers = clustered_measure(base_rows, tuned_rows)         # instructions: an answer's instructions together
    flag, flagged, message = verdict(report)                   # Holm across the measured rates and the team's voice

A measure is flagged when Holm's step-down rejects its one-sided test at a family-wise 5%: a model with no real
change on any measure is flagged in at most 5% of checks (tests/unit/ship/eval/test_family.py simulates it). The
95% intervals shown are each measure's own, not corrected: an interval that excludes zero on a measure the
correction does not reject is shown, not flagged (docs/retention.md, "The flag").
"""

from __future__ import annotations

from finetune.ship.eval.family import FAMILY_ALPHA, cluster_bootstrap, holm, paired_p, sign_test
from finetune.ship.eval.intervals import paired_difference, wilson

MEASURES = {  # key in retention.json: what a reader calls it (a drop beyond chance flags)
    "accuracy": "accuracy",
    "rule_pass_rate": "rule pass-rate",
    "choice_accuracy": "multiple-choice accuracy",
    "instruction_following": "instruction following",
    "instructions_kept": "instructions kept",
}
TEAM_VOICE = "general answers in the team's voice"  # team_voice: a rise beyond chance flags
LABELS = {**MEASURES, "team_voice": TEAM_VOICE}


def measure(base_ok: list[bool], tuned_ok: list[bool], direction: str = "drop") -> dict:
    """One rate of both models on the same items: each with its Wilson interval, the paired change, and the exact
    one-sided p of a `direction` ("drop", or "rise") beyond chance; `verdict` decides the drop across the check."""
    n = len(base_ok)

    def side(ok: list[bool]) -> dict:
        low, high = wilson(sum(ok), n)
        return {"rate": sum(ok) / n if n else 0.0, "correct": sum(ok), "low": low, "high": high}

    change = paired_difference(base_ok, tuned_ok)
    return {"n": n, "base": side(base_ok), "tuned": side(tuned_ok), "change": change, "p": paired_p(change, direction),
            "dropped": False}  # fmt: skip


def clustered_measure(base_rows: list[list[bool]], tuned_rows: list[list[bool]]) -> dict:
    """A rate of items that come in clusters (the instructions of one answer): its change's interval resamples whole
    answers (family.cluster_bootstrap), its test flips whole answers' differences."""
    differences = [sum(t) - sum(b) for b, t in zip(base_rows, tuned_rows, strict=True)]
    flat = measure(_flat(base_rows), _flat(tuned_rows))
    return flat | {"change": cluster_bootstrap(base_rows, tuned_rows), "p": sign_test(differences, "drop")}


def points(change: float) -> str:
    """A change of a rate in whole percentage points, signed: '+3', '-31', '+0'."""
    return f"{round(100 * change):+d}"


def describe(key: str, numbers: dict) -> str:
    """'accuracy 62% -> 31% (change -31 points, 95% interval -38 to -24)', and for a measure the verdict flags its
    one-sided p, raw and after Holm's correction: '; p 0.0001, 0.0006 corrected'."""
    change = numbers["change"]
    tested = f"; p {numbers['p']:.2g}, {numbers['p_holm']:.2g} corrected" if numbers.get("dropped") or numbers.get(
        "rose"
    ) else ""  # fmt: skip
    return (
        f"{LABELS[key]} {numbers['base']['rate']:.0%} -> {numbers['tuned']['rate']:.0%} "
        f"(change {points(change['value'])} points, 95% interval {points(change['low'])} to {points(change['high'])}"
        f"{tested})"
    )


def verdict(report: dict) -> tuple[bool, list[str], str]:
    """(flag, the measures that changed beyond chance, the verdict in plain words). Each measured rate's exact
    one-sided test (a drop; the team's voice: a rise), Holm's correction across them (family.py): the measures
    rejected at a family-wise 5% set `dropped` (`rose`) and `p_holm` on their numbers."""
    measured = [m for m in MEASURES if m in report and report[m]["n"]]
    voice = report.get("team_voice") or {}
    tested = measured + (["team_voice"] if voice.get("n") else [])
    decided = holm({m: (voice if m == "team_voice" else report[m])["p"] for m in tested})
    for m in tested:
        numbers = voice if m == "team_voice" else report[m]
        numbers["p_holm"] = decided[m]["p_holm"]
        numbers["rose" if m == "team_voice" else "dropped"] = decided[m]["rejected"]
    flagged = [m for m in tested if decided[m]["rejected"]]
    if flagged:
        drops = "; ".join(describe(m, voice if m == "team_voice" else report[m]) for m in flagged)
        message = (
            f"Tuning cost the model some of what it knew: {drops}. Each change is more than chance with the check's "
            f"{len(tested)} measures taken together (Holm's correction: an unchanged model is flagged in at most "
            f"{FAMILY_ALPHA:.0%} of checks)."
        )
    else:
        parts = [describe(m, report[m]) for m in measured] + ([describe("team_voice", voice)] if voice.get("n") else [])
        message = "No drop beyond chance on the general set: " + "; ".join(parts) + "."
    return bool(flagged), flagged, message


def _flat(rows: list[list[bool]]) -> list[bool]:
    return [value for row in rows for value in row]


def cut_sentence(cut: dict | None) -> str | None:
    """retention.json's `cut_at_cap` in a line: 'answers cut at the token cap: short answers (48 tokens) base 2%,
    tuned 3%; longer answers (320 tokens) base 9%, tuned 21%' (None for a report without it)."""
    if not cut:
        return None
    parts = [
        f"{label} ({cut[kind]['cap']} tokens) base {cut[kind]['base']['share']:.0%}, tuned {cut[kind]['tuned']['share']:.0%}"
        for kind, label in (("prompts", "short answers"), ("requests", "longer answers"))
        if kind in cut
    ]
    return "answers cut at the token cap (an instruction on an answer's end then fails): " + "; ".join(parts)
