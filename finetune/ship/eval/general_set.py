"""The general set `finetune eval RUN --retention` asks, shipped in finetune/ship/eval/general/, and its answer checks.

    prompts, choices = load_general_set()
    passed(prompt, "The capital of Peru is Lima.")    # -> True
    requests = load_instructions()                    # longer answers with rules on their form (instructions.py)

Written by examples/generate_retention.py (seeded; the files are committed, reviewable, never trained on).
A prompt's check is one of:

number   a number in the answer equals one of the accepted values; numbers the prompt itself contains do not
         count (so "23 plus 12 is 35" is judged by its 35). Digits ("1,945", "35.0") and English number words
         up to ninety-nine ("eight", "twenty-four") are read.
any_of   one of the terms appears in the answer as a whole word or phrase, in any case ("Lima", "da Vinci").
regex    the answer matches the pattern (re.search, `.` matches newlines): the rule of the instruction is kept.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from finetune.ship.eval.instructions import Instruction

GENERAL_DIR = Path(__file__).resolve().parent / "general"
PROMPTS_FILE, CHOICES_FILE, INSTRUCTIONS_FILE = "prompts.jsonl", "choices.jsonl", "instructions.jsonl"
ANSWER_KINDS = ("arithmetic", "conversion", "fact")  # scored for accuracy; "rule" prompts for the rule pass-rate


@dataclass(frozen=True)
class GeneralPrompt:
    id: str
    kind: str  # arithmetic | conversion | fact | rule
    prompt: str
    check: dict
    rule: str | None = None

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]


@dataclass(frozen=True)
class Choice:
    id: str
    question: str
    lead: str  # the reply's first words; each option continues them
    options: tuple[str, ...]
    answer: int  # index of the right option

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.question}]


@dataclass(frozen=True)
class InstructionRequest:
    """A request for a longer answer with one or two instructions on its form (examples/generate_instructions.py)."""

    id: str
    task: str
    prompt: str
    instructions: tuple[Instruction, ...]

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@cache
def load_general_set(folder: Path = GENERAL_DIR) -> tuple[tuple[GeneralPrompt, ...], tuple[Choice, ...]]:
    prompts = tuple(
        GeneralPrompt(row["id"], row["kind"], row["prompt"], row["check"], row.get("rule"))
        for row in _rows(folder / PROMPTS_FILE)
    )
    choices = tuple(
        Choice(row["id"], row["question"], row["lead"], tuple(row["options"]), row["answer"])
        for row in _rows(folder / CHOICES_FILE)
    )
    return prompts, choices


@cache
def load_instructions(folder: Path = GENERAL_DIR) -> tuple[InstructionRequest, ...]:
    return tuple(
        InstructionRequest(
            row["id"], row["task"], row["prompt"],
            tuple(Instruction(i["kind"], i.get("args", {})) for i in row["instructions"]),
        )
        for row in _rows(folder / INSTRUCTIONS_FILE)
    )  # fmt: skip


def set_digest(folder: Path = GENERAL_DIR) -> str:
    """A short fingerprint of the set's files: numbers from different sets are not comparable."""
    digest = hashlib.sha256()
    for name in (PROMPTS_FILE, CHOICES_FILE, INSTRUCTIONS_FILE):
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:12]


# ------------------------------------------------------------------------------------------------ numbers

UNITS = {
    word: value
    for value, word in enumerate(
        ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
        + ["thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
    )
}
TENS = {
    word: 10 * i
    for i, word in enumerate(["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], start=2)
}
# digits not glued to a letter (H2O, CO2 are no numbers), with optional thousands commas and decimals
DIGITS = r"(?<![A-Za-z\d.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
WORDS = (
    r"\b(?:" + "|".join(TENS) + r")(?:[- ](?:" + "|".join(list(UNITS)[1:10]) + r"))?\b|\b(?:" + "|".join(UNITS) + r")\b"
)
NUMBER = re.compile(f"{DIGITS}|{WORDS}", re.IGNORECASE)


def _value(text: str) -> float:
    word = text.lower()
    if word[0].isdigit():
        return float(word.replace(",", ""))
    parts = re.split(r"[- ]", word)
    return float(TENS.get(parts[0], UNITS.get(parts[0], 0)) + (UNITS[parts[1]] if len(parts) > 1 else 0))


def numbers_in(text: str) -> list[float]:
    """Every number written in `text`, in order."""
    return [_value(match.group()) for match in NUMBER.finditer(text)]


# ------------------------------------------------------------------------------------------------ checks


def _has_term(answer: str, term: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(term)}(?!\w)", answer, re.IGNORECASE) is not None


@cache
def _pattern(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.DOTALL)


def passed(item: GeneralPrompt, answer: str) -> bool:
    """Whether `answer` passes the item's check."""
    check = item.check
    if "number" in check:
        given = set(numbers_in(item.prompt))
        new = [n for n in numbers_in(answer) if n not in given]
        return any(abs(n - float(want)) < 1e-9 for n in new for want in check["number"])
    if "any_of" in check:
        return any(_has_term(answer, term) for term in check["any_of"])
    if "regex" in check:
        return _pattern(check["regex"]).search(answer) is not None
    raise ValueError(f"{item.id}: unknown check {sorted(check)}")
