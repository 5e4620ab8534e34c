"""The invented-specifics scan's fast path (issue 49): each pattern runs only over texts that hold what its matches need,
a text's values are read once (cached), and a conversation's context only up to the last reply stating a specific.
It must find exactly what the straightforward scan found: every pattern over every text, the context's values read
again for every reply. That scan is kept here, word for word as it was, and both read a varied corpus: the bundled
examples, generated support conversations, and texts built from every kind's forms, in other cases, scripts and
spacings (non-ASCII letters the patterns fold: "ſ" reads as "s", the Kelvin sign as "k")."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from finetune.data import detectors, invented, sensitive, specifics
from finetune.data import specifics as s
from finetune.data.invented import given_texts, reply_texts
from finetune.data.read import parse_bytes
from finetune.data.skipped import usable_conversations
from finetune.data.types import Conversation, Message

REPO = Path(__file__).resolve().parents[3]

# ----------------------------------------------------------------------------- the scan as it was (reference)


def _old_finders(text: str):
    for match in s._URL.finditer(text):
        value = match.group(0).rstrip(".,;:!?)]}")
        bare = re.sub(r"(?i)^(?:https?://)?(?:www\.)?", "", value).rstrip("/").lower()
        yield "url", (match.start(), match.start() + len(value), frozenset({f"url:{bare}"}))
    for span in detectors.email_spans(text):
        yield "email", (span.start, span.end, frozenset({f"email:{text[span.start : span.end].lower()}"}))
    for pattern in (s._TRACKING_UPS, s._TRACKING_AFTER_WORD, s._TRACKING_CODE):
        for m in pattern.finditer(text):
            yield "tracking", (m.start("value"), m.end("value"), frozenset({s._code_key(m.group("value"))}))
    for pattern in (s._DATE_MONTH_DAY, s._DATE_DAY_MONTH):
        for m in pattern.finditer(text):
            yield (
                "date",
                (m.start(), m.end(), frozenset({s._date_key(s._month(m.group("month")), s._day(m.group("day")))})),
            )
    for m in s._DATE_MONTH_YEAR.finditer(text):
        yield "date", (m.start(), m.end(), frozenset({f"date:{m.group('year')}-{s._month(m.group('month')):02d}"}))
    for m in s._DATE_ISO.finditer(text):
        yield "date", (m.start(), m.end(), frozenset({s._date_key(int(m.group("month")), int(m.group("day")))}))
    for m in s._DATE_NUMERIC.finditer(text):
        a, b = int(m.group("a")), int(m.group("b"))
        readings = {s._date_key(mo, d) for mo, d in ((a, b), (b, a)) if 1 <= mo <= 12 and 1 <= d <= 31}
        if readings:
            yield "date", (m.start(), m.end(), frozenset(readings))
    for pattern in (s._AMOUNT_BEFORE, s._AMOUNT_AFTER):
        for m in pattern.finditer(text):
            if key := s.number_key(m.group("value")):
                yield "amount", (m.start(), m.end(), frozenset({key}))
    for pattern in (s._ENDING, s._MASKED_ENDING):
        for m in pattern.finditer(text):
            yield "ending", (m.start("digits"), m.end("digits"), frozenset({f"n:{int(m.group('digits'))}"}))
    for pattern in (s._ID_AFTER_WORD, s._ID_HASH, s._ID_CODE):
        for m in pattern.finditer(text):
            yield "identifier", (m.start("value"), m.end("value"), frozenset({s._code_key(m.group("value"))}))
    for span in detectors.phone_spans(text):
        digits = re.sub(r"\D", "", text[span.start : span.end])
        yield "phone", (span.start, span.end, frozenset({f"phone:{digits[-9:]}"}))
    for m in s._TIME_12.finditer(text):
        hour = int(m.group("hour")) % 12 + (12 if m.group("half").lower() == "p" else 0)
        yield "time", (m.start(), m.end(), frozenset({f"time:{hour:02d}:{int(m.group('minute') or 0):02d}"}))
    for m in s._TIME_24.finditer(text):
        yield "time", (m.start(), m.end(), frozenset({f"time:{int(m.group('hour')):02d}:{m.group('minute')}"}))
    for m in s._TIME_WORD.finditer(text):
        yield (
            "time",
            (m.start(), m.end(), frozenset({"time:00:00" if m.group(0).lower() == "midnight" else "time:12:00"})),
        )


def old_find(text: str) -> list[specifics.Specific]:
    if not text or not s._MAYBE.search(text):
        return []
    found: dict[str, list] = {kind: [] for kind, _ in s.FINDERS}
    for kind, hit in _old_finders(text):
        found[kind].append(hit)
    kept: list[specifics.Specific] = []
    for kind, _ in s.FINDERS:  # the finders' order: on overlap the earlier one's value wins
        for start, end, keys in sorted(found[kind], key=lambda f: (f[0], -f[1])):
            if not any(start < k.end and k.start < end for k in kept):
                kept.append(specifics.Specific(kind, start, end, keys))
    return sorted(kept, key=lambda x: x.start)


def old_known(texts) -> set[str]:
    known: set[str] = set()
    for text in texts:
        for found in old_find(text):
            known |= found.keys
        for m in s._NUMBERS.finditer(text):
            if key := s.number_key(m.group(0)):
                known.add(key)
            digits = re.sub(r"\D", "", m.group(0))
            if len(digits) >= 8:
                known.add(f"n:{int(digits[-4:])}")
        for word in s._WORD_WITH_DIGIT.findall(text):
            known.add(s._code_key(word))
    return known


def old_scan(conversation: Conversation) -> list[invented.Invented]:
    found = []
    known = old_known(given_texts((), conversation.tools))
    for index, message in enumerate(conversation.messages):
        if message.role == "assistant" and message.weight > 0:
            for text in reply_texts(message):
                seen, mine = set(), []
                for x in old_find(text):
                    if x.keys & known or x.keys in seen:
                        continue
                    seen.add(x.keys)
                    mine.append(x)
                found += [invented.Invented(conversation.line, index, x.kind) for x in mine]
        known |= old_known(given_texts((message,)))
    return found


# ----------------------------------------------------------------------------- the corpus

FORMS = [
    "order BR-46304",
    "ticket INC0012345",
    "order 123456",
    "Case #4821",
    "account no. 99-1234-5",
    "rma 0012",
    "$94.42",
    "94.42 USD",
    "12.50 EUR",
    "1,094.40 dollars",
    "€ 30",
    "30€",
    "£5",
    "¥1200",
    "CHF 12",
    "94.42",
    "July 28",
    "28 July 2024",
    "2024-07-28",
    "November 2023",
    "05/06/2024",
    "24/7",
    "1.2.24",
    "Sept. 3rd, 2021",
    "6 pm",
    "6:30 p.m.",
    "18:30",
    "noon",
    "Midnight",
    "12 AM",
    "7am",
    "10:61",
    "ending in 4821",
    "ends with ****4821",
    "last four digits are 4821",
    "xxxx-4821",
    "•••• 4821",
    "XxX4821",
    "+1 415 555 2671",
    "(415) 555-2671",
    "020 7946 0958",
    "555-0100",
    "jane.doe@example.com",
    "Jane.Doe@Example.COM",
    "https://brightside.example/help/billing.",
    "www.x.org/a?b=1",
    "tracking number 1Z999AA10123456784",
    "JD014600006281234567",
    "tracking # ab-1234567",
    "TRACKING: 9400111899",
    "4111111111114821",
    "br46304",
    "BR46304",
    "4K",
    "MP3",
    "Home 200",
    "Gamer 800",
    "5 to 7 business days",
    "ſep 5",
    "\u212aase #12345",
    "ORDER\u00a0#5555",
    "ORDER:\t777-888",
    "Ticket\n\n#99999",
    "am 5",
    "pm",
    "Refunds up to 50 EUR",
    "2024-07-28 18:30:01 ERROR code=0x1F timeout after 30000 ms",
    "tel. 0800 123 4567",
]
GLUE = [" ", ", ", ". ", "\n", " - ", " on ", " at ", " for ", " by ", "; ", " and ", "(", ")", ": ", "", "\t"]
WORDS = ["Hi", "thanks", "your", "refund", "was", "the", "card", "we", "called", "example", "team", "Marcus", "Grüße"]


def _text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 8)):
        piece = rng.choice(FORMS) if rng.random() < 0.6 else rng.choice(WORDS)
        piece = piece.upper() if rng.random() < 0.1 else piece.lower() if rng.random() < 0.1 else piece
        parts += [piece, rng.choice(GLUE)]
    return "".join(parts)


def _conversation(rng: random.Random, line: int) -> Conversation:
    messages = [Message("system", _text(rng))] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 3)):
        messages.append(Message("user", _text(rng)))
        messages.append(Message("assistant", _text(rng), weight=0.0 if rng.random() < 0.15 else 1.0))
    return Conversation(tuple(messages), line)


def _read(path: Path) -> list[Conversation]:
    conversations, _ = usable_conversations(parse_bytes(path.read_bytes(), path.name, None), skip_invalid=True)
    return conversations


def _corpus() -> list[Conversation]:
    rng = random.Random("specifics-fast-path")
    made = [_conversation(rng, line) for line in range(1, 401)]
    sys.path.insert(0, str(REPO / "bench"))
    from data import generate_conversations  # bench/data.py: support-style conversations, pasted logs among them

    generated = "".join(json.dumps(c) + "\n" for c in generate_conversations(120, seed=3)).encode()
    support, _ = usable_conversations(parse_bytes(generated, "support.jsonl", None), skip_invalid=True)
    return made + support + _read(REPO / "examples" / "train.jsonl") + _read(REPO / "examples" / "test.jsonl")


# short texts of the characters the patterns and their gates turn on: a gate that asks for more than its pattern
# needs (a wrong digit range, a missing separator) shows up here as a specific the fast path misses
PIECES = [
    *"0123456789",
    *"0123456789",
    *":-/.,#*xX•$€@ \n\t",
    "am",
    "p.m",
    "PM",
    "jul",
    "Sept",
    "ſep",
    "order",
    "no.",
    "ending in ",
    "last 4 ",
    "tracking ",
    "1Z",
    "USD",
    "eur",
    "dollars",
    "noon",
    "www.",
    "://",
    "ABC",
    "K",
]


def _short_texts(count: int) -> list[str]:
    rng = random.Random("specifics-fast-path-short")
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 14))) for _ in range(count)]


def _clear() -> None:
    specifics._specifics.cache_clear()
    specifics.text_keys.cache_clear()
    detectors._phone_spans.cache_clear()


def test_the_fast_path_finds_exactly_what_the_full_scan_found():
    _clear()
    corpus = _corpus()
    texts = [t for c in corpus for m in c.messages for t in reply_texts(m)]
    assert sum(bool(old_find(t)) for t in texts) > 500  # the corpus is full of specifics of every kind
    for text in texts:
        assert specifics.find_specifics(text) == old_find(text), text
        assert specifics.known_keys([text]) == old_known([text]), text
    for text in _short_texts(4000):
        assert specifics.find_specifics(text) == old_find(text), text
    for conversation in corpus:
        assert invented.scan_conversation(conversation) == old_scan(conversation), conversation.line
    assert {x.kind for c in corpus for x in old_scan(c)} == set(specifics.KINDS)


def test_one_pass_of_both_scans_equals_the_two_passes():
    _clear()
    corpus = _corpus()
    for redact in (False, True):
        conversations, values = sensitive.scan_conversations(corpus, redact)
        assert invented.scan_both(corpus, redact) == (conversations, values, invented.scan_replies(conversations))
