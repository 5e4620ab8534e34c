r"""Specifics in a reply, and whether the conversation before it gave them (docs/answers.md).

    found = find_specifics(text)            # [Specific(kind, start, end, keys)], in order, none overlapping
    known = known_keys(context_texts)       # every value the conversation given to the model holds
    invented(text, known)                   # the specifics of `text` that `known` does not hold

A specific is a value a customer would act on, of one of KINDS: an identifier (order, ticket, account: BR-46304,
INC0012345, order 123456, #4821), an amount ($94.42, 12 EUR), a date (July 28, 28 July 2024, 2024-07-28, November
2023), a time of day (6 pm, 18:30, noon), a card or account ending (ending in 4821, ****4821), a phone number, an
e-mail address, a URL, a tracking code (1Z..., tracking number ..., a long code of capitals and digits). Durations,
counts and plan names ("5 to 7 business days", "Home 200") are not specifics: a reply states them as policy.

Each specific carries its normalised keys, so the same value written two ways is one value: "$94.42", "94.42 USD"
and a bare "94.42" are `n:94.42`; "July 28", "28 July" and "July 28th, 2024" are `date:07-28`; "br-46304" and
"BR46304" are `id:BR46304`; "6 pm" and "18:00" are `time:18:00`. A numeric date that reads both ways (05/06/2024)
has both keys. A specific is grounded when one of its keys is among the conversation's (`known_keys`: the keys of
its own specifics, each of its numbers, and the last four digits of each long one), invented when none is.

Nothing here imports torch; the phone and e-mail finders are sensitive.py's (libphonenumber, one expression).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from finetune.data.detectors import email_spans, phone_spans

KINDS = ("identifier", "amount", "date", "time", "ending", "phone", "email", "url", "tracking")
NAMES = {
    "identifier": "identifier (order, ticket, account)",
    "amount": "amount",
    "date": "date",
    "time": "time of day",
    "ending": "card or account ending",
    "phone": "phone number",
    "email": "e-mail address",
    "url": "URL",
    "tracking": "tracking code",
}
PLURALS = {"identifier": "identifiers (order, ticket, account)", "time": "times of day",
           "ending": "card or account endings", "email": "e-mail addresses"}  # fmt: skip

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH = r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
_DAY = r"(?:3[01]|[12]\d|0?[1-9])(?:st|nd|rd|th)?"
_YEAR = r"(?:19|20)\d\d"
_DATE_MONTH_DAY = re.compile(rf"(?i)\b(?P<month>{_MONTH})\s+(?P<day>{_DAY})\b(?:,?\s+(?P<year>{_YEAR})\b)?")
_DATE_DAY_MONTH = re.compile(rf"(?i)\b(?P<day>{_DAY})\s+(?:of\s+)?(?P<month>{_MONTH})(?:,?\s+(?P<year>{_YEAR}))?\b")
_DATE_MONTH_YEAR = re.compile(rf"(?i)\b(?P<month>{_MONTH})\s+(?P<year>{_YEAR})\b")
_DATE_ISO = re.compile(r"\b(?P<year>(?:19|20)\d\d)-(?P<month>0?[1-9]|1[0-2])-(?P<day>3[01]|[12]\d|0?[1-9])\b")
# with a year only: "24/7" is a service's hours, not a date
_DATE_NUMERIC = re.compile(r"\b(?P<a>\d{1,2})[/.](?P<b>\d{1,2})[/.](?P<year>(?:19|20)?\d\d)\b")
_TIME_12 = re.compile(r"(?i)\b(?P<hour>1[0-2]|0?[1-9])(?::(?P<minute>[0-5]\d))?\s*(?P<half>[ap])\.?m\b\.?")
_TIME_24 = re.compile(r"(?<![\d:.])(?P<hour>[01]?\d|2[0-3]):(?P<minute>[0-5]\d)(?![\d:])")
_TIME_WORD = re.compile(r"(?i)\b(?:noon|midday|midnight)\b")
_CURRENCY = r"(?:[$€£¥]|\b(?:USD|EUR|GBP|CAD|AUD|CHF)\s?)"
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d{1,2})?|\d+(?:\.\d{1,2})?"
_AMOUNT_BEFORE = re.compile(rf"{_CURRENCY}\s?(?P<value>{_NUMBER})(?![\d.,]\d)")
_AMOUNT_AFTER = re.compile(
    rf"(?i)(?<![\d.,])(?P<value>{_NUMBER})\s?(?:(?:USD|EUR|GBP|CAD|AUD|CHF|dollars?|euros?|pounds?)\b|€)"
)
_ENDING = re.compile(
    r"(?i)\b(?:end(?:ing|s|ed)\s+(?:in\s+|with\s+)?|last\s+(?:four|4)(?:\s+digits)?(?:\s+(?:of|are|is))?[:\s]+)"
    r"(?:[*x•·]+\s?)?(?P<digits>\d{4})\b"
)
_MASKED_ENDING = re.compile(r"(?<![\w*•])[*xX•]{3,}[\s-]?(?P<digits>\d{4})\b")
_ID_KEYWORDS = (r"order|ticket|case|account|acct|reference|ref|invoice|booking|confirmation|claim|customer|member|"
                r"policy|contract|subscription|request|incident|reservation|transaction|return|rma")  # fmt: skip
_ID_AFTER_WORD = re.compile(
    rf"(?i)\b(?:{_ID_KEYWORDS})(?:\s+(?:number|no\.?|num|id|code))?\s*[:#]?\s*#?(?P<value>\d[\d-]{{2,}}\d)\b"
)
_ID_HASH = re.compile(r"(?<![\w&])#(?P<value>\d{3,})\b")
# letters then digits, one separator at most between them: BR-46304, INC0012345, CASE-2024-001 (not 4K, MP3, Hub 3)
_ID_CODE = re.compile(r"(?i)(?<![\w-])(?P<value>[a-z]{1,6}[-_]?\d{3,}(?:[-_]?[a-z0-9]+)*)(?![\w-])")
_TRACKING_UPS = re.compile(r"(?<!\w)(?P<value>1Z[0-9A-Z]{16})(?!\w)")
_TRACKING_AFTER_WORD = re.compile(
    r"(?i)\btracking\s*(?:number|code|id|no\.?|#)?\s*(?:is\s+)?[:#]?\s*(?P<value>(?=[a-z-]*\d)[a-z0-9][a-z0-9-]{7,})\b"
)
# twelve or more capitals and digits, both present: a carrier's code (a word in capitals has no digit; an order or
# ticket id such as INC0012345 is shorter)
_TRACKING_CODE = re.compile(r"(?<![\w-])(?P<value>(?=[A-Z0-9]*[A-Z])(?=[A-Z0-9]*\d)[A-Z0-9]{12,})(?![\w-])")
_URL = re.compile(r"(?i)\b(?:https?://|www\.)[^\s<>\"'`]+")
_NUMBERS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_WORD_WITH_DIGIT = re.compile(r"(?<![\w-])(?=[\w-]*[A-Za-z])(?=[\w-]*\d)[A-Za-z0-9][\w-]*")
# _NUMBERS begun with its first digit (a place the engine skips to): the same matches, tests/unit/data/test_specifics_fast
_NUMBERS_AT_DIGIT = re.compile(r"\d(?:(?<![\d.]\d)\d{0,2}(?:,\d{3})+(?:\.\d+)?|\d*(?:\.\d+)?)")
_MAYBE = re.compile(r"(?i)\d|@|www\.|://|noon|midday|midnight")  # a text with none of these holds no specific


@dataclass(frozen=True)
class Specific:
    """One value found in a text: its kind, its place, and the keys it is known by (never printed by summaries)."""

    kind: str
    start: int
    end: int
    keys: frozenset[str]


# ----------------------------------------------------------------------------- normalising


def number_key(text: str) -> str | None:
    """'1,094.40' -> 'n:1094.4'; None for what is not a number."""
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None
    normal = format(value.normalize(), "f")
    return f"n:{normal}"


def _month(text: str) -> int:
    return _MONTHS.index(text[:3].casefold()) + 1  # casefold: the patterns read "ſep" as "sep", lower() does not


def _day(text: str) -> int:
    return int(re.sub(r"\D", "", text))


def _date_key(month: int, day: int) -> str:
    return f"date:{month:02d}-{day:02d}"


def _code_key(text: str) -> str:
    """An identifier or code without case or separators; one of digits only is a number ('order 0123' = '123')."""
    alnum = re.sub(r"[^0-9A-Za-z]", "", text).upper()
    return f"n:{int(alnum)}" if alnum.isdigit() else f"id:{alnum}"


# ----------------------------------------------------------------------------- one finder per kind

# A pattern runs only over a text that holds what every match of it must hold (a currency sign, a month's first three
# letters, "tracking", ...): a substring test costs a fraction of a regular-expression pass, and most texts hold none
# of these. Case-insensitive needles are tested on the lower-cased text only when the text is ASCII: there `lower()` is
# exactly the patterns' case folding (elsewhere, "ſ" matches "s"), so other texts run every pattern.
_ID_WORDS = tuple(_ID_KEYWORDS.split("|"))
# What a match must hold, as patterns that start with a digit or a fixed set of characters: the engine skips to those
# (no attempt at every position), so each costs a few microseconds where the pattern it stands for costs tens.
_NEEDS_DIGITS = re.compile(r"\d\d\d")  # _ID_CODE
_NEEDS_ID_VALUE = re.compile(r"\d[\d-]{2,}\d")  # _ID_AFTER_WORD
_NEEDS_CODE = re.compile(r"[A-Z0-9]{12}")  # _TRACKING_CODE
_NEEDS_ISO = re.compile(r"\d-\d")  # _DATE_ISO
_NEEDS_NUMERIC_DATE = re.compile(r"\d[/.]\d")  # _DATE_NUMERIC
_NEEDS_HALF_DAY = re.compile(r"(?i)\d\s*[ap]\.?m")  # _TIME_12
_NEEDS_CLOCK = re.compile(r"\d:[0-5]\d")  # _TIME_24
_NEEDS_CURRENCY_AFTER = re.compile(r"(?i)\d\s?(?:USD|EUR|GBP|CAD|AUD|CHF|dollar|euro|pound|€)")  # _AMOUNT_AFTER
_NEEDS_MASK = re.compile(r"[*xX•]{3}")  # _MASKED_ENDING


class _Text:
    """A text, and the cheap tests of what a pattern needs to find anything in it."""

    __slots__ = ("text", "low")

    def __init__(self, text: str) -> None:
        self.text = text
        self.low = text.lower() if text.isascii() else None

    def has(self, *needles: str) -> bool:
        """Whether the text holds one of `needles` as written."""
        return any(needle in self.text for needle in needles)

    def holds(self, pattern: re.Pattern) -> bool:
        return pattern.search(self.text) is not None

    def says(self, *needles: str) -> bool:
        """Whether the text may hold one of the lower-case `needles` in any case (True when that is not cheap)."""
        return self.low is None or any(needle in self.low for needle in needles)

    def places(self, *needles: str) -> list[int] | None:
        """Where the lower-case `needles` start, in any case; None when that is not cheap (not ASCII)."""
        if self.low is None:
            return None
        found = []
        for needle in needles:
            at = self.low.find(needle)
            while at != -1:
                found.append(at)
                at = self.low.find(needle, at + 1)
        return found

    def at(self, pattern: re.Pattern, starts: Iterable[int] | None) -> Iterator[re.Match]:
        """`pattern.finditer(text)` for a pattern whose every match starts at one of `starts`: the engine tries those
        places only, in order, each after the last match's end as finditer does (None: every place)."""
        if starts is None:
            yield from pattern.finditer(self.text)
            return
        end = 0
        for start in sorted(set(starts)):
            if start >= end and (match := pattern.match(self.text, start)):
                yield match
                end = max(match.end(), start + 1)


Found = tuple[int, int, frozenset[str]]


def _urls(t: _Text) -> Iterable[Found]:
    if not (t.has("://") or t.says("www.")):
        return
    for match in _URL.finditer(t.text):
        value = match.group(0).rstrip(".,;:!?)]}")
        bare = re.sub(r"(?i)^(?:https?://)?(?:www\.)?", "", value).rstrip("/").lower()
        yield match.start(), match.start() + len(value), frozenset({f"url:{bare}"})


def _emails(t: _Text) -> Iterable[Found]:
    for span in email_spans(t.text):
        yield span.start, span.end, frozenset({f"email:{t.text[span.start : span.end].lower()}"})


def _phones(t: _Text) -> Iterable[Found]:
    for span in phone_spans(t.text):
        digits = re.sub(r"\D", "", t.text[span.start : span.end])
        yield span.start, span.end, frozenset({f"phone:{digits[-9:]}"})  # +1 555 ... and (555) ... alike


def _tracking(t: _Text) -> Iterable[Found]:
    patterns = (
        (_TRACKING_UPS, t.has("1Z")),
        (_TRACKING_AFTER_WORD, t.says("tracking")),
        (_TRACKING_CODE, t.holds(_NEEDS_CODE)),
    )
    for pattern, possible in patterns:
        for match in pattern.finditer(t.text) if possible else ():
            yield match.start("value"), match.end("value"), frozenset({_code_key(match.group("value"))})


def _dates(t: _Text) -> Iterable[Found]:
    named = t.says(*_MONTHS)
    for pattern in (_DATE_MONTH_DAY, _DATE_DAY_MONTH) if named else ():
        for match in pattern.finditer(t.text):
            key = _date_key(_month(match.group("month")), _day(match.group("day")))
            yield match.start(), match.end(), frozenset({key})
    for match in _DATE_MONTH_YEAR.finditer(t.text) if named else ():
        yield match.start(), match.end(), frozenset({f"date:{match.group('year')}-{_month(match.group('month')):02d}"})
    for match in _DATE_ISO.finditer(t.text) if t.holds(_NEEDS_ISO) else ():
        key = _date_key(int(match.group("month")), int(match.group("day")))
        yield match.start(), match.end(), frozenset({key})
    for match in _DATE_NUMERIC.finditer(t.text) if t.holds(_NEEDS_NUMERIC_DATE) else ():
        a, b = int(match.group("a")), int(match.group("b"))
        readings = {_date_key(m, d) for m, d in ((a, b), (b, a)) if 1 <= m <= 12 and 1 <= d <= 31}
        if readings:  # month first (US) or day first: either may be what the conversation says
            yield match.start(), match.end(), frozenset(readings)


def _amounts(t: _Text) -> Iterable[Found]:
    patterns = (
        (_AMOUNT_BEFORE, t.has("$", "€", "£", "¥", "USD", "EUR", "GBP", "CAD", "AUD", "CHF")),
        (_AMOUNT_AFTER, t.holds(_NEEDS_CURRENCY_AFTER)),
    )
    for pattern, possible in patterns:
        for match in pattern.finditer(t.text) if possible else ():
            key = number_key(match.group("value"))
            if key:
                yield match.start(), match.end(), frozenset({key})


def _endings(t: _Text) -> Iterable[Found]:
    patterns = ((_ENDING, t.says("end", "last")), (_MASKED_ENDING, t.holds(_NEEDS_MASK)))
    for pattern, possible in patterns:
        for match in pattern.finditer(t.text) if possible else ():
            yield match.start("digits"), match.end("digits"), frozenset({f"n:{int(match.group('digits'))}"})


def _identifiers(t: _Text) -> Iterable[Found]:
    after_word = t.at(_ID_AFTER_WORD, t.places(*_ID_WORDS)) if t.holds(_NEEDS_ID_VALUE) else ()  # at a keyword
    hashed = t.at(_ID_HASH, t.places("#")) if t.has("#") else ()
    coded = t.at(_ID_CODE, _code_starts(t)) if t.holds(_NEEDS_DIGITS) else ()
    for match in itertools.chain(after_word, hashed, coded):
        yield match.start("value"), match.end("value"), frozenset({_code_key(match.group("value"))})


def _code_starts(t: _Text) -> list[int] | None:
    """Where _ID_CODE can match: the start of the one to six letters (then a separator or none) before a run of three
    digits or more; None when that is not cheap (not ASCII: the pattern's letters fold other characters)."""
    if t.low is None:
        return None
    text, starts = t.text, []
    for run in _NEEDS_DIGITS.finditer(text):  # the first three digits of each run (later threes follow a digit)
        end = run.start() - (run.start() > 0 and text[run.start() - 1] in "-_")
        start = end
        while start > 0 and end - start < 7 and text[start - 1].isalpha():
            start -= 1
        if 1 <= end - start <= 6:
            starts.append(start)
    return starts


def _times(t: _Text) -> Iterable[Found]:
    for match in _TIME_12.finditer(t.text) if t.holds(_NEEDS_HALF_DAY) else ():
        hour = int(match.group("hour")) % 12 + (12 if match.group("half").lower() == "p" else 0)
        yield match.start(), match.end(), frozenset({f"time:{hour:02d}:{int(match.group('minute') or 0):02d}"})
    colons = [c - k for c in t.places(":") or () for k in (1, 2) if c >= k] if t.low is not None else None  # hh:
    for match in t.at(_TIME_24, colons) if t.holds(_NEEDS_CLOCK) else ():
        yield match.start(), match.end(), frozenset({f"time:{int(match.group('hour')):02d}:{match.group('minute')}"})
    for match in _TIME_WORD.finditer(t.text) if t.says("noon", "midday", "midnight") else ():
        yield (
            match.start(),
            match.end(),
            frozenset({"time:00:00" if match.group(0).lower() == "midnight" else "time:12:00"}),
        )


# on overlap the earlier finder's value wins: a URL holds identifiers, an e-mail address digits, a date a number
FINDERS: tuple[tuple[str, Callable[[_Text], Iterable[Found]]], ...] = (
    ("url", _urls),
    ("email", _emails),
    ("tracking", _tracking),
    ("date", _dates),
    ("amount", _amounts),
    ("ending", _endings),
    ("identifier", _identifiers),
    ("phone", _phones),
    ("time", _times),
)


def find_specifics(text: str) -> list[Specific]:
    """Every specific in `text`, in order, none overlapping another."""
    return list(_specifics(text))


@lru_cache(maxsize=4096)  # a text read twice (a reply, then the context of the next; a system prompt on every line)
def _specifics(text: str) -> tuple[Specific, ...]:
    if not text or not _MAYBE.search(text):
        return ()
    kept: list[Specific] = []
    seen = _Text(text)
    for kind, finder in FINDERS:
        for start, end, keys in sorted(finder(seen), key=lambda f: (f[0], -f[1])):
            if not any(start < k.end and k.start < end for k in kept):
                kept.append(Specific(kind, start, end, keys))
    return tuple(sorted(kept, key=lambda s: s.start))


# ----------------------------------------------------------------------------- grounded or invented


def known_keys(texts: Iterable[str]) -> set[str]:
    """Every value the texts hold: the keys of their specifics, each number in them (a bare '94.42' grounds
    '$94.42'), and the last four digits of each number of eight digits or more (a card number grounds its ending)."""
    known: set[str] = set()
    for text in texts:
        known |= text_keys(text)
    return known


@lru_cache(maxsize=4096)
def text_keys(text: str) -> frozenset[str]:
    """`known_keys` of one text."""
    known: set[str] = set()
    for specific in _specifics(text):
        known |= specific.keys
    for match in _NUMBERS_AT_DIGIT.finditer(text):
        if key := number_key(match.group(0)):
            known.add(key)
        digits = re.sub(r"\D", "", match.group(0))
        if len(digits) >= 8:
            known.add(f"n:{int(digits[-4:])}")
    for word in _WORD_WITH_DIGIT.findall(text):
        known.add(_code_key(word))  # 'br46304' in lower case grounds 'BR-46304'
    return frozenset(known)


def invented(text: str, known: set[str]) -> list[Specific]:
    """The specifics of `text` whose keys the conversation (`known`, from known_keys) never holds, one per value."""
    seen: set[frozenset[str]] = set()
    out = []
    for specific in find_specifics(text):
        if specific.keys & known or specific.keys in seen:
            continue
        seen.add(specific.keys)
        out.append(specific)
    return out
