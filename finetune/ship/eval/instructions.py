"""Instructions on the form of a longer answer, and the checks that say whether an answer keeps them.

    follows(Instruction("postscript", {"marker": "P.S."}), answer)     # -> True when a line starts with P.S.
    kept = [follows(i, answer) for i in item.instructions]             # strict: all(kept); per instruction: each

The retention check's instruction-following part (eval/retention.py) asks requests for answers of 100-200 words
that carry one or two such instructions (general/instructions.jsonl, written by examples/generate_instructions.py).
Each check reads the answer as a program would, with no judge: a title in double angle brackets, a postscript, a
number of placeholders or bullet points, JSON, words that must or must not appear, a letter's frequency, a length,
lowercase or capitals, no commas, an ending sentence, quotation marks, paragraphs or sections, highlighted parts.
Words are matched whole and in any case; a count is of the answer as written (markdown included).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

WORD = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?")


@dataclass(frozen=True)
class Instruction:
    kind: str
    args: dict

    def to_dict(self) -> dict:
        return {"kind": self.kind, **({"args": self.args} if self.args else {})}


def _words(text: str) -> list[str]:
    return WORD.findall(text)


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(word)}(?![A-Za-z0-9])", text, re.IGNORECASE) is not None


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def _title(answer: str, args: dict) -> bool:
    return re.search(r"<<[^<>\n]*[A-Za-z0-9][^<>\n]*>>", answer) is not None


def _postscript(answer: str, args: dict) -> bool:
    """A line that starts with the marker (after markdown emphasis), with words after it."""
    marker = re.escape(args["marker"]).replace(r"\ ", r"\s*")
    return re.search(rf"(?im)^[\s*_>]*{marker}\s*\S", answer) is not None


def _placeholders(answer: str, args: dict) -> bool:
    return len(re.findall(r"\[[^\[\]\n]*[A-Za-z0-9][^\[\]\n]*\]", answer)) >= args["at_least"]


def _bullets(answer: str, args: dict) -> bool:
    """Markdown bullets (`* ` or `- ` starting a line), exactly the number asked."""
    return sum(1 for line in _lines(answer) if re.match(r"[*-]\s+\S", line)) == args["exactly"]


def _json(answer: str, args: dict) -> bool:
    text = answer.strip()
    fenced = re.fullmatch(r"```(?:json|JSON)?\s*\n?(.*?)\n?```", text, re.DOTALL)
    try:
        json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return False
    return True


def _forbidden_words(answer: str, args: dict) -> bool:
    return not any(_has_word(answer, word) for word in args["words"])


def _keywords(answer: str, args: dict) -> bool:
    return all(_has_word(answer, word) for word in args["words"])


def _letter_frequency(answer: str, args: dict) -> bool:
    return answer.lower().count(args["letter"]) >= args["at_least"]


def _word_count(answer: str, args: dict) -> bool:
    count = len(_words(answer))
    return count >= args["at_least"] if "at_least" in args else count < args["less_than"]


def _lowercase(answer: str, args: dict) -> bool:
    return any(c.isalpha() for c in answer) and answer == answer.lower()


def _capitals(answer: str, args: dict) -> bool:
    return any(c.isalpha() for c in answer) and answer == answer.upper()


def _no_commas(answer: str, args: dict) -> bool:
    return "," not in answer and "，" not in answer


def _end_phrase(answer: str, args: dict) -> bool:
    """The answer's last words are the sentence asked for (closing quotes or emphasis after it allowed)."""
    return re.sub(r"[\s\"'*_”’]+$", "", answer).lower().endswith(args["phrase"].lower())


def _quoted(answer: str, args: dict) -> bool:
    text = answer.strip()
    return len(text) > 2 and text[0] in '"“' and text[-1] in '"”'


def _paragraphs(answer: str, args: dict) -> bool:
    """Exactly the number of paragraphs asked, separated by markdown dividers (***)."""
    parts = re.split(r"(?m)^\s*\*\*\*\s*$", answer)
    return len(parts) == args["exactly"] and all(part.strip() for part in parts)


def _sections(answer: str, args: dict) -> bool:
    """Sections marked by their word and number at the start of a line ("Section 1"): at least the number asked."""
    word = re.escape(args["word"])
    return len(set(re.findall(rf"(?im)^[\s#*_]*{word}\s+(\d+)", answer))) >= args["at_least"]


def _highlights(answer: str, args: dict) -> bool:
    """Parts emphasised with markdown (*part* or **part**): at least the number asked."""
    return len(re.findall(r"(?<![*\w])\*{1,2}[^*\n]*[A-Za-z][^*\n]*\*{1,2}(?![*\w])", answer)) >= args["at_least"]


CHECKS: dict[str, Callable[[str, dict], bool]] = {
    "title": _title,
    "postscript": _postscript,
    "placeholders": _placeholders,
    "bullets": _bullets,
    "json": _json,
    "forbidden_words": _forbidden_words,
    "keywords": _keywords,
    "letter_frequency": _letter_frequency,
    "word_count": _word_count,
    "lowercase": _lowercase,
    "capitals": _capitals,
    "no_commas": _no_commas,
    "end_phrase": _end_phrase,
    "quoted": _quoted,
    "paragraphs": _paragraphs,
    "sections": _sections,
    "highlights": _highlights,
}


def follows(instruction: Instruction, answer: str) -> bool:
    """Whether `answer` keeps `instruction`."""
    check = CHECKS.get(instruction.kind)
    if check is None:
        raise ValueError(f"unknown instruction {instruction.kind!r}")
    return check(answer, instruction.args)
