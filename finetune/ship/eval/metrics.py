r"""Answer-quality numbers: per example, then overall; and the team's own rules as regular expressions.

exact_match    the answer equals the reference (case, surrounding and repeated whitespace ignored)
token_f1       word overlap with the reference (SQuAD's F1): rewards the team's wording, not correctness
rouge_l        longest common subsequence F-measure (Google's rouge-score package)
answer_length  words in the answer
rule:NAME      1 when the answer matches the rule's regular expression (--rule NAME=REGEX)

A rule is searched in the whole answer with `.` matching newlines too: `^` is the answer's start, `$` its
end. So `greeting=^Hi there` asks for the greeting first, `signoff=Warm regards,\s*Sam$` for the sign-off
last, and `no_sorry=^(?!.*sorry)` for a phrase nowhere in the answer. `(?i)` ignores case, `(?m)` makes
`^`/`$` match at every line.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache

from finetune.settings.errors import UserError

NUMBERS = ("exact_match", "token_f1", "rouge_l", "answer_length")


def _normalize(text: str) -> str:
    return " ".join(text.lower().split())


def exact_match(answer: str, reference: str) -> float:
    return float(_normalize(answer) == _normalize(reference))


def token_f1(answer: str, reference: str) -> float:
    """Harmonic mean of word precision and recall against the reference (case-insensitive)."""
    got, want = re.findall(r"\w+", answer.lower()), re.findall(r"\w+", reference.lower())
    common = sum((Counter(got) & Counter(want)).values())
    if not got or not want or not common:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


@cache
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(answer: str, reference: str) -> float:
    return _rouge().score(reference, answer)["rougeL"].fmeasure


def answer_length(answer: str) -> int:
    return len(answer.split())


def parse_rules(given: list[str]) -> dict[str, re.Pattern]:
    """`--rule NAME=REGEX` (repeatable) -> {NAME: compiled pattern}; a bad one is the user's error, named."""
    rules: dict[str, re.Pattern] = {}
    for item in given:
        name, sep, pattern = item.partition("=")
        if not sep or not name.strip() or not pattern:
            raise UserError(f"--rule expects NAME=REGEX (e.g. greeting='^Hi there'), got {item!r}")
        try:
            rules[name.strip()] = re.compile(pattern, re.DOTALL)
        except re.error as exc:
            raise UserError(f"--rule {name.strip()}: {pattern!r} is not a regular expression: {exc}") from None
    return rules


def score(answer: str, reference: str, rules: dict[str, re.Pattern]) -> dict[str, float]:
    """Every number for one answer."""
    numbers = {
        "exact_match": exact_match(answer, reference),
        "token_f1": token_f1(answer, reference),
        "rouge_l": rouge_l(answer, reference),
        "answer_length": float(answer_length(answer)),
    }
    numbers.update({f"rule:{name}": float(bool(rule.search(answer))) for name, rule in rules.items()})
    return numbers


def summarize(scores: list[dict[str, float]]) -> dict[str, float]:
    """Means over the examples (for rules: the share of answers that follow them)."""
    if not scores:
        return {}
    return {key: sum(s[key] for s in scores) / len(scores) for key in scores[0]}


def rule_win_rate(base: list[dict[str, float]], other: list[dict[str, float]], rules: list[str]) -> dict:
    """Per example, the model that follows more of the rules wins; ties are counted apart."""
    keys = [f"rule:{name}" for name in rules]
    wins = ties = losses = 0
    for before, after in zip(base, other, strict=True):
        a, b = sum(after[k] for k in keys), sum(before[k] for k in keys)
        wins, ties, losses = wins + (a > b), ties + (a == b), losses + (a < b)
    n = len(base)
    return {"wins": wins, "ties": ties, "losses": losses, "win_rate": wins / n if n else 0.0}
