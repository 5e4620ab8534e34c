"""Auto's rule for the forgetting curve (`general_val`): on when the run already rehearses the base's own answers.

The curve is a second validation set: held-out general prompts answered by the base model, never trained on
(docs/retention.md, "Forgetting curve"). Its price is the base answering them once per base and chat template
(cached; self-replay asks the same of the base for its training rows) and a short evaluation at each validation.
"""

from __future__ import annotations

from finetune.rules.auto import Choice

# A run shorter than this is a smoke test (max_steps): no forgetting curve, no adapter scale measured, so the base
# answers no held-out general prompts for it (their generation alone can take longer than such a run).
SHORT_RUN_STEPS = 10


def short_run(steps: int) -> str | None:
    """Why a run of `steps` optimizer steps measures nothing general; None when it is long enough."""
    if steps >= SHORT_RUN_STEPS:
        return None
    return (
        f"a run of {steps} step(s) (under {SHORT_RUN_STEPS}: a smoke test) has nothing general to watch or scale back, "
        "and the base would first answer the held-out general prompts for it"
    )


def auto_general_val(replay: bool, general_data: bool, objective: str, steps: int | None = None) -> Choice[bool]:
    """On with self-replay from the base's answers (the base already answers general prompts for the run); off
    otherwise: without replay, with a team's own general conversations (nothing is generated for those), for
    preference tuning, whose validation scores pairs, not answers, and for a run of a few steps."""
    if objective == "dpo":
        return Choice(False, "preference tuning scores pairs of answers: the curve scores supervised answers")
    if steps is not None and (short := short_run(steps)) is not None:
        return Choice(False, f"off: {short}")
    if replay and not general_data:
        return Choice(
            True,
            "self-replay is on: the base model answers general prompts for this run anyway, so its answers to the "
            "held-out ones draw a forgetting curve beside validation (a short evaluation at each validation)",
        )
    why = "your general conversations replace the base's answers in replay" if replay else "self-replay is off"
    return Choice(
        False,
        f"off because {why}: the curve would have the base model answer the held-out general prompts (once per base, "
        "cached)",
    )
