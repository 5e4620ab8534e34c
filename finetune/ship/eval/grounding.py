"""Answers the team would sign: invented specifics, recited training replies and distinct answers (docs/answers.md).

    section = measure(conversations, {"base": [...], "tuned": [...]}, training_replies_of(run))
    line(section)          # 'answers: tuned invents a specific in 12% (6-22%) of 60 answers, ...'

For every model and for the team's own references (each test conversation's final reply), on the same prompts:

invented   the share of answers that state a specific (data/specifics.py: an identifier, an amount, a date or time,
           a card or account ending, a phone number, an e-mail address, a URL, a tracking code) that appears nowhere
           in the conversation given to the model; the references' rate is the floor the data itself teaches
recited    the share of answers that recite a reply of the run's training file (data/recitation.py: equal, or
           nearly so, with nothing of their own conversation in it); None when the training file is not at hand
distinct   how many different answers there are (case, punctuation and spacing ignored)

Each with Wilson's 95% interval (intervals.py; for `distinct`, on the share of answers that differ from every
earlier one, as if each were drawn apart: a guide). The verdict compares on the same prompts (Newcombe's paired
interval shown): the tuned model invents more than the references, or recites more than the base does, beyond chance
by an exact one-sided paired test with Holm's correction across the two (family.py: at most 5% false flags).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from finetune.data.invented import given_texts
from finetune.data.prompting import prompt_of
from finetune.data.recitation import TrainingReplies, distinct_answers
from finetune.data.specifics import invented, known_keys
from finetune.data.types import Conversation
from finetune.settings.wording import act, ref
from finetune.ship.eval.family import holm, paired_p
from finetune.ship.eval.intervals import paired_difference, wilson
from finetune.ship.eval.team_data import team_training

REFERENCE = "reference"  # the team's own replies: the test file's final assistant messages
GROUNDING_FILE = "grounding.json"  # RUN/grounding.json: the demo's section (finetune eval keeps it in eval.json)
MEASURES = {"invented": "invents a specific", "recited": "recites a training reply", "distinct": "distinct answers"}


def training_replies_of(run: str | Path) -> tuple[TrainingReplies | None, str | None]:
    """The team's replies a run trained on (team_data.py: the team's rows alone, never a replay row, each named by the
    team's file and its line) and that file's name; (None, None) when it is not at hand."""
    team = team_training(run)
    if team is None:
        return None, None
    return TrainingReplies.from_conversations(team.conversations), team.file


def checks(conversations: Sequence[Conversation], answers: Sequence[str], training: TrainingReplies | None) -> list:
    """Per answer: {"invented": [kinds of the specifics its conversation never gave], "recites_line": line or None}."""
    out = []
    for conversation, answer in zip(conversations, answers, strict=True):
        context = given_texts(prompt_of(conversation), conversation.tools)
        kinds = [s.kind for s in invented(answer, known_keys(context))]
        recites = training.recited(answer, context) if training is not None else None
        out.append({"invented": kinds, "recites_line": recites})
    return out


def _rate(count: int, n: int) -> dict:
    low, high = wilson(count, n)
    return {"count": count, "n": n, "rate": count / n if n else 0.0, "low": low, "high": high}


def _model(rows: list[dict], answers: Sequence[str], training: TrainingReplies | None) -> dict:
    n = len(rows)
    kinds: dict[str, int] = {}
    for row in rows:
        for kind in dict.fromkeys(row["invented"]):
            kinds[kind] = kinds.get(kind, 0) + 1
    recited = sum(row["recites_line"] is not None for row in rows)
    return {
        "invented": _rate(sum(bool(row["invented"]) for row in rows), n) | {"by_kind": kinds},
        "recited": _rate(recited, n) if training is not None else None,
        "distinct": _rate(distinct_answers(answers), n),
    }


def measure(
    conversations: Sequence[Conversation],
    answers: dict[str, Sequence[str]],
    training: tuple[TrainingReplies | None, str | None] = (None, None),
) -> tuple[dict, dict[str, list[dict]]]:
    """eval.json's `grounding` section (and demo.json's): per model and for the references, with the verdict; and
    each answer's own checks (`checks`), by model."""
    replies, name = training
    references = [c.messages[-1].content for c in conversations]
    flags = {model: checks(conversations, got, replies) for model, got in answers.items()}
    flags[REFERENCE] = checks(conversations, references, replies)
    said = dict(answers) | {REFERENCE: references}
    section = {
        "answers": len(conversations),
        "training_file": name,
        "training_replies": len(replies) if replies is not None else None,
        "models": {model: _model(rows, said[model], replies) for model, rows in flags.items()},
    }
    section |= verdict(flags, replies is not None)
    return section | {"message": line(section)}, flags


def verdict(flags: dict[str, list[dict]], recitals: bool) -> dict:
    """Does the tuned model invent more than the references, or recite more than the base, beyond chance? Each an
    exact one-sided paired test, Holm's correction across the two (family.py): a model that changed nothing is
    flagged in at most 5% of checks."""
    judged = "tuned" if "tuned" in flags else next(m for m in flags if m != REFERENCE)
    mine = flags[judged]
    more_invented = paired_difference(
        [bool(r["invented"]) for r in flags[REFERENCE]], [bool(r["invented"]) for r in mine]
    )
    base = flags.get("base", [{"recites_line": None}] * len(mine))
    more_recited = paired_difference(
        [r["recites_line"] is not None for r in base], [r["recites_line"] is not None for r in mine]
    )
    tested = {"invented": more_invented} | ({"recited": more_recited} if recitals else {})
    decided = holm({name: paired_p(change, "rise") for name, change in tested.items()})
    for name, change in tested.items():
        change |= {"p": decided[name]["p"], "p_holm": decided[name]["p_holm"]}
    invents, recites = decided["invented"]["rejected"], recitals and decided["recited"]["rejected"]
    remedies = []
    if invents or recites:
        remedies = [
            f"Train fewer epochs ({ref('epochs')}), or keep an earlier checkpoint ({act('compare_checkpoints')}): "
            "replies a model cannot work out from the conversation are learned late, by heart.",
            "Give the facts in the conversation (a tool result, the system message) or write a placeholder the "
            "application fills, so replies take their specifics from what the model is given (the plan warns of the "
            "replies that do not).",
        ]
    return {
        "judged": judged,
        "invented_vs_reference": more_invented,
        "recited_vs_base": more_recited if recitals else None,
        "flag": bool(invents or recites),
        "remedies": remedies,
    }


def not_judged(section: dict, why: str) -> dict:
    """The section's numbers without a verdict, for a model the check cannot judge (the demo's toy base): `flag`
    None, no remedies, and why under `not_judged` and in its message."""
    section = section | {"flag": None, "remedies": [], "not_judged": why}
    return section | {"message": line(section)}


def cell(key: str, numbers: dict | None) -> str:
    """One measure of one model: '12% (6-22%)'; distinct answers as '58/60 (88-99%)'; 'n/a' for recitals without
    the training file."""
    if numbers is None:
        return "n/a"
    shown = f"{numbers['count']}/{numbers['n']}" if key == "distinct" else f"{numbers['rate']:.0%}"
    return f"{shown} ({numbers['low']:.0%}-{numbers['high']:.0%})"


def _side(numbers: dict) -> str:
    return f"{numbers['rate']:.0%} ({numbers['low']:.0%}-{numbers['high']:.0%})"


def line(section: dict) -> str:
    """One line: 'answers: tuned invents a specific in 12% (6-22%) of 60, the team's replies in 8% (3-18%), base 17%;
    recites a training reply in 0 of 60 (base 0); 58 distinct answers of 60 (the team's 60)'."""
    models, judged, n = section["models"], section["judged"], section["answers"]
    mine, team = models[judged], models[REFERENCE]
    text = (
        f"{judged} invents a specific in {_side(mine['invented'])} of {n} answers, the team's replies in "
        f"{_side(team['invented'])}"
    )
    if "base" in models and judged != "base":
        text += f", base {models['base']['invented']['rate']:.0%}"
    if mine["recited"] is not None:
        text += f"; recites a training reply in {mine['recited']['count']} of {n}"
        text += f" (base {models['base']['recited']['count']})" if "base" in models and judged != "base" else ""
    else:
        text += "; recitals not measured (the training file is not at hand)"
    text += f"; {mine['distinct']['count']} distinct answers of {n} (the team's {team['distinct']['count']})"
    if section.get("not_judged"):
        return f"{text}; not judged: {section['not_judged']}"
    return text + (": flagged, more than chance" if section["flag"] else "")
