"""Sensitive data in conversations: e-mail addresses, phone numbers, payment cards, IBANs and secrets, found
before training (docs/sensitive-data.md).

    spans = find_spans(text)                                  # [Span(kind, start, end, detector)], no overlaps
    conversations, found = scan_conversations(conversations, redact=True)   # values replaced by <EMAIL>, ...
    summary = summarize(found, "train.jsonl", setting="redact")             # counts, roles, lines: never a value

The detectors are well-kept libraries, each doing what it is maintained for:

- phone numbers: Google's libphonenumber (`phonenumbers`, its PhoneNumberMatcher at the VALID leniency: a number
  in international form anywhere, in national form for the regions of PHONE_REGIONS);
- payment cards: `python-stdnum`'s Luhn check on runs of 13-19 digits (spaces or dashes between groups) that start
  like a card number (2-6); a run that fails the check is not a card;
- IBANs: `python-stdnum`'s IBAN check (the country's length and format, and the ISO 7064 mod-97 check digits);
- secrets: the detectors of Yelp's `detect-secrets` (AWS keys, GitHub/GitLab/Slack/Stripe/OpenAI/... tokens, JSON
  web tokens, private key blocks, passwords in URLs), their own patterns run over the text;
- e-mail addresses: one regular expression (no maintained finder exists outside Presidio, whose spaCy stack is
  ~370 MB and whose e-mail check fetches the public suffix list over the network: the docs say why).

Nothing here imports torch; the libraries load on the first scan (import-light for `finetune plan --examples`).
A Span says where a value is and what kind it is, never the value: summaries, messages, JSON and events carry
counts, roles and lines only.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache, lru_cache

from finetune.data.types import Conversation, Message, Problem
from finetune.settings.errors import DataError
from finetune.settings.wording import ref

KINDS = ("email", "phone", "card", "iban", "secret")
PLACEHOLDERS = {"email": "<EMAIL>", "phone": "<PHONE>", "card": "<CARD>", "iban": "<IBAN>", "secret": "<SECRET>"}
NAMES = {"email": "e-mail address", "phone": "phone number", "card": "payment card number", "iban": "IBAN",
         "secret": "secret"}  # fmt: skip
PHONE_REGIONS = ("US", "GB")  # national-form numbers of these regions; international (+CC ...) ones from anywhere
# a phone number has 7 digits or more, a few separators apart at most: a text without such a run holds none, and the
# matcher (the slow part of a scan) is not run on it
_PHONE_DIGITS = re.compile(r"\d(?:[\s().\-/]{0,3}\d){6,}")
LINES_LISTED = 20  # a summary names this many lines per file at most (the counts are exact)
# detect-secrets' detectors that are not about secrets (public IP addresses), or look at the words around a value
# in source code (keyword, high entropy): in prose they flag ordinary sentences
_NOT_USED = frozenset({"IPPublicDetector", "KeywordDetector", "Base64HighEntropyString", "HexHighEntropyString"})

# Words each detector's patterns cannot match without (read from detect-secrets' patterns: the key word of an
# assignment, a vendor's host or prefix): a text holding none of them, in lower case, is not run through them. They
# only save time (the slowest patterns start with look-behinds that defeat the regex engine's prefix search).
_NEEDS = {
    "AWS Access Key": ("a3t", "abia", "acca", "akia", "asia", "aws"),
    "Artifactory Credentials": ("akc", "ap"),
    "Cloudant Credentials": ("key", "pw", "pass", "token", "cloudant"),
    "IBM Cloud IAM Key": ("key", "pwd", "pass", "token"),
    "GitLab Token": ("gl", "gr1348941"),
    "IBM COS HMAC Credentials": ("secret",),
    "JSON Web Token": ("eyj",),
    "Mailchimp Access Key": ("-us",),
    "Private Key": ("begin", "putty"),
    "Slack Token": ("xox", "hooks.slack.com"),
    "SoftLayer Credentials": ("key", "pwd", "pass", "token", "softlayer"),
    "Telegram Bot Token": (":",),
}
# Every value the detectors below find is a run of 20 characters or more without a space (a key, a token, a hash),
# an Artifactory key (AKC..., AP...: 11 or more), or comes with one of _SECRET_WORDS (a URL's ://, a private key's
# BEGIN, a Slack xox- token, a JSON web token's eyJ, an npm _authToken): a text with none of them is not run through
# them (most messages). A detector a later detect-secrets adds is not in _CHECKED: it runs on every text.
_SECRET_RUN = re.compile(r"[A-Za-z0-9+/=_\-.:]{20,}|(?:AKC|AP)[A-Za-z0-9]{8,}")
_SECRET_WORDS = ("://", "begin", "putty", "xox", "eyj", "_authtoken")
_SECRET_WORD = re.compile("|".join(re.escape(w) for w in _SECRET_WORDS))
_CHECKED = frozenset({
    "AWS Access Key", "Artifactory Credentials", "Azure Storage Account access key", "Basic Auth Credentials",
    "Cloudant Credentials", "Discord Bot Token", "GitHub Token", "GitLab Token", "IBM Cloud IAM Key",
    "IBM COS HMAC Credentials", "JSON Web Token", "Mailchimp Access Key", "NPM tokens", "OpenAI Token", "Private Key",
    "PyPI Token", "SendGrid API Key", "Slack Token", "SoftLayer Credentials", "Square OAuth Secret",
    "Stripe Access Key", "Telegram Bot Token", "Twilio API Key",
})  # fmt: skip
_EMAIL = re.compile(r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+"
                    r"[A-Za-z]{2,24}(?![\w-])")  # fmt: skip
_CARD_DIGITS = re.compile(r"\d(?:[ -]?\d){12}")  # what every card candidate holds: a quick look before _CARD
_CARD = re.compile(r"(?<![\d-])[2-6]\d{3}(?:[ -]?\d){9,15}(?![\d])")  # candidates only: Luhn decides
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{1,4}){3,8}\b")  # candidates only: the mod-97 check decides
_PRIVATE_KEY_END = re.compile(r"-----END[ A-Z0-9]*PRIVATE KEY[ A-Z0-9]*-----")


@dataclass(frozen=True)
class Span:
    """One value found in a text: its kind and place, and the detector that found it (never the value)."""

    kind: str
    start: int
    end: int
    detector: str


@dataclass(frozen=True)
class Found:
    """One value found in a conversation, as summaries name it: file line, role, kind, place in the message."""

    line: int
    message: int  # index of the message in its conversation
    role: str
    kind: str
    field: str  # "content", or "tool_calls[i].arguments"
    start: int
    end: int


# ----------------------------------------------------------------------------- one text


@cache
def _secret_detectors() -> tuple:
    """detect-secrets' regex detectors (loaded once; the library is imported on the first scan)."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    classes = get_mapping_from_secret_type_to_class().values()
    chosen = [c for c in classes if issubclass(c, RegexBasedDetector) and c.__name__ not in _NOT_USED]
    return tuple((c.secret_type, tuple(c.denylist)) for c in sorted(chosen, key=lambda c: c.__name__))


def _secrets(text: str) -> list[Span]:
    spans = []
    lower = text.lower()
    none = not _SECRET_RUN.search(text) and not _SECRET_WORD.search(lower)
    for secret_type, patterns in _secret_detectors():
        if none and secret_type in _CHECKED:
            continue
        if secret_type in _NEEDS and not any(word in lower for word in _NEEDS[secret_type]):
            continue
        for pattern in patterns:
            for match in pattern.finditer(text):
                start, end = _value_of(match)
                if "PRIVATE KEY" in match.group(0):  # the header found: the whole block is the secret
                    block_end = _PRIVATE_KEY_END.search(text, end)
                    start, end = match.start(), block_end.end() if block_end else len(text)
                    while start > 0 and text[start - 1] == "-":  # its opening dashes too
                        start -= 1
                spans.append(Span("secret", start, end, secret_type))
    return spans


def _value_of(match: re.Match) -> tuple[int, int]:
    """Where the secret is in a detector's match: its group where the group is the value (a password in a URL,
    a key after its name), the whole match where the group is only a prefix (ghp_, glpat-) or a small part."""
    for i in range(1, (match.lastindex or 0) + 1):
        start, end = match.span(i)
        if start > match.start() and end - start >= 8:
            return start, end
    return match.span()


def email_spans(text: str) -> list[Span]:
    if "@" not in text:
        return []
    return [Span("email", m.start(), m.end(), "e-mail pattern") for m in _EMAIL.finditer(text)]


@cache
def _library(name: str):
    """A detector's library, imported on the first scan that needs it (not on every call: a scan calls them often)."""
    import importlib

    return importlib.import_module(name)


def _cards(text: str) -> list[Span]:
    if not _CARD_DIGITS.search(text):
        return []
    luhn = _library("stdnum.luhn")
    spans = []
    for match in _CARD.finditer(text):
        digits = re.sub(r"[ -]", "", match.group(0))
        if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
            spans.append(Span("card", match.start(), match.end(), "Luhn (python-stdnum)"))
    return spans


def _ibans(text: str) -> list[Span]:
    iban = _library("stdnum.iban")
    spans = []
    for match in _IBAN.finditer(text):
        groups = match.group(0).split(" ") if " " in match.group(0) else [match.group(0)]
        while groups:  # a candidate may run into the next upper-case word: drop trailing groups until it checks
            candidate = " ".join(groups)
            if len(candidate.replace(" ", "")) >= 15 and iban.is_valid(candidate):
                spans.append(Span("iban", match.start(), match.start() + len(candidate), "IBAN (python-stdnum)"))
                break
            groups.pop()
    return spans


def phone_spans(text: str) -> list[Span]:
    return list(_phone_spans(text)) if _PHONE_DIGITS.search(text) else []


@lru_cache(maxsize=1024)  # the costliest detector: a text is asked twice (its sensitive values, then its specifics)
def _phone_spans(text: str) -> tuple[Span, ...]:
    phonenumbers = _library("phonenumbers")
    spans = {}
    for region in PHONE_REGIONS:
        for match in phonenumbers.PhoneNumberMatcher(text, region, leniency=phonenumbers.Leniency.VALID):
            spans[(match.start, match.end)] = Span("phone", match.start, match.end, "libphonenumber")
    return tuple(spans.values())


DETECTORS = (_secrets, _ibans, email_spans, _cards, phone_spans)  # on overlap the earlier detector's span wins


def find_spans(text: str) -> list[Span]:
    """Every sensitive value in `text`, in order, none overlapping another."""
    if not text:
        return []
    kept: list[Span] = []
    for detect in DETECTORS:
        for span in sorted(detect(text), key=lambda s: (s.start, -s.end)):
            if not any(span.start < k.end and k.start < span.end for k in kept):
                kept.append(span)
    return sorted(kept, key=lambda s: s.start)


def redact_text(text: str, spans: list[Span] | list[Found]) -> str:
    """`text` with each span replaced by its kind's placeholder (<EMAIL>, <PHONE>, <CARD>, <IBAN>, <SECRET>)."""
    for span in sorted(spans, key=lambda s: s.start, reverse=True):
        text = text[: span.start] + PLACEHOLDERS[span.kind] + text[span.end :]
    return text


# ----------------------------------------------------------------------------- conversations


def _texts(message: Message) -> list[tuple[str, str]]:
    """(field, text) of a message that are scored or read: its content and each tool call's arguments."""
    texts = [("content", message.content)]
    texts += [(f"tool_calls[{i}].arguments", call.arguments) for i, call in enumerate(message.tool_calls)]
    return texts


def scan_conversation(conversation: Conversation) -> list[Found]:
    found = []
    for index, message in enumerate(conversation.messages):
        for where, text in _texts(message):
            for span in find_spans(text):
                found.append(Found(conversation.line, index, message.role, span.kind, where, span.start, span.end))
    return found


def redact_conversation(conversation: Conversation, found: list[Found]) -> Conversation:
    """The conversation with every value in `found` replaced by its placeholder."""
    if not found:
        return conversation
    messages = list(conversation.messages)
    for index in sorted({f.message for f in found}):
        message = messages[index]
        mine = [f for f in found if f.message == index]
        content = redact_text(message.content, [f for f in mine if f.field == "content"])
        calls = tuple(
            dataclasses.replace(call, arguments=redact_text(call.arguments, [f for f in mine if f.field == where]))
            for where, call in ((f"tool_calls[{i}].arguments", c) for i, c in enumerate(message.tool_calls))
        )
        messages[index] = dataclasses.replace(message, content=content, tool_calls=calls)
    return dataclasses.replace(conversation, messages=tuple(messages))


def scan_conversations(conversations: list[Conversation], redact: bool = False) -> tuple[list[Conversation], list]:
    """Every value found in `conversations`, and the conversations (with placeholders in place when `redact`)."""
    found_all: list[Found] = []
    out = []
    for conversation in conversations:
        found = scan_conversation(conversation)
        found_all += found
        out.append(redact_conversation(conversation, found) if redact else conversation)
    return out, found_all


def scan_pairs(pairs: list, redact: bool = False) -> tuple[list, list[Found]]:
    """`scan_conversations` for preference pairs (data/preference.py): the prompt, then the chosen answer, then the
    rejected one, as the messages of one conversation."""
    found_all: list[Found] = []
    out = []
    for pair in pairs:
        whole = Conversation((*pair.prompt, pair.chosen, pair.rejected), pair.line, tools=pair.tools)
        found = scan_conversation(whole)
        found_all += found
        if redact and found:
            messages = redact_conversation(whole, found).messages
            pair = dataclasses.replace(pair, prompt=messages[:-2], chosen=messages[-2], rejected=messages[-1])
        out.append(pair)
    return out, found_all


def redacted(conversations: list[Conversation]) -> list[Conversation]:
    return scan_conversations(conversations, redact=True)[0]


# ----------------------------------------------------------------------------- summaries (never a value)


def summarize(found: list[Found], file: str, setting: str = "warn") -> dict:
    """What was found in one file, as JSON: counts by kind, by role and by both, and the lines (the first
    LINES_LISTED of them). `replaced` counts the values the placeholders took the place of (redact)."""
    lines = sorted({f.line for f in found})
    return {
        "setting": setting,
        "total": len(found),
        "by_kind": dict(Counter(f.kind for f in found)),
        "by_role": dict(Counter(f.role for f in found)),
        "by_kind_and_role": {
            kind: dict(Counter(f.role for f in found if f.kind == kind)) for kind in KINDS if any(f.kind == kind for f in found)
        },
        "replaced": len(found) if setting == "redact" else 0,
        "files": {file: {"values": len(found), "lines": lines[:LINES_LISTED], "line_count": len(lines)}} if found else {},
    }  # fmt: skip


def merge(summaries: list[dict]) -> dict:
    """One summary of several files' (the data file's and the validation file's)."""
    merged = summarize([], "", summaries[0]["setting"] if summaries else "warn")
    for s in summaries:
        merged["total"] += s["total"]
        merged["replaced"] += s["replaced"]
        for key in ("by_kind", "by_role"):
            merged[key] = dict(Counter(merged[key]) + Counter(s[key]))
        for kind, roles in s["by_kind_and_role"].items():
            merged["by_kind_and_role"][kind] = dict(Counter(merged["by_kind_and_role"].get(kind, {})) + Counter(roles))
        merged["files"] |= s["files"]
    return merged


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{('es' if noun.endswith('s') else 's') * (n != 1)}"


def sentence(summary: dict) -> str:
    """One sentence of a summary: '5 values: 2 e-mail addresses (1 in assistant replies), ...; train.jsonl lines
    3, 5 and 9'. No value is ever in it."""
    parts = []
    for kind in KINDS:
        if kind not in summary["by_kind"]:
            continue
        n = summary["by_kind"][kind]
        in_replies = summary["by_kind_and_role"].get(kind, {}).get("assistant", 0)
        parts.append(_count(n, NAMES[kind]) + (f" ({in_replies:,} in assistant replies)" if in_replies else ""))
    places = []
    for file, where in summary["files"].items():
        shown = ", ".join(str(line) for line in where["lines"])
        more = (
            f" and {where['line_count'] - len(where['lines'])} more"
            if where["line_count"] > len(where["lines"])
            else ""
        )
        places.append(f"{file} line{'s' * (where['line_count'] != 1)} {shown}{more}")
    return f"{_count(summary['total'], 'value')}: {', '.join(parts)}; {'; '.join(places)}"


def of_sides(found_by_source: dict[str, list[Found]], setting: str) -> dict:
    """One summary of a run's files, each named by the setting that names it ("data", "val_file"): the token
    cache keeps it so, since an entry is keyed by the files' bytes and a renamed file reads the same entry."""
    return merge([summarize(found, source, setting) for source, found in found_by_source.items()])


def named(stored: dict | None, names: dict[str, str]) -> dict | None:
    """A summary kept by `of_sides`, its files named as this run names them."""
    if stored is None:
        return None
    return stored | {"files": {names.get(source, source): where for source, where in stored["files"].items()}}


def refuse_if_found(summary: dict | None) -> None:
    """With sensitive_data refuse, any value found stops the run here, before planning: one message, no value."""
    if summary is None or summary["setting"] != "refuse" or not summary["total"]:
        return
    raise DataError(
        f"sensitive data found, so {ref('sensitive_data', 'refuse')} stops before planning: {sentence(summary)}. "
        f"Remove them from the data, or train on placeholders (<EMAIL>, <CARD>, ...) with "
        f"{ref('sensitive_data', 'redact')}; `finetune validate` lists them (docs/sensitive-data.md)"
    )


# ----------------------------------------------------------------------------- `finetune validate`, the previews

SENSITIVE_DATA = "sensitive_data"  # the validation code (docs/formats.md)
FINDINGS_LISTED = 1000  # --json's "findings" lists this many at most (the counts are exact)


def scanned_file(parsed, setting: str):
    """A read file (ParsedFile, or preference.py's file of pairs) scanned: its conversations or pairs (with
    placeholders when `setting` is redact), one
    `sensitive_data` problem when anything was found (an error with refuse, else a warning), and the summary
    `finetune validate --json` prints (with the place of each value found, never the value)."""
    if hasattr(parsed, "pairs"):
        pairs, found = scan_pairs(parsed.pairs, setting == "redact")
        parsed = dataclasses.replace(parsed, pairs=pairs)
    else:
        conversations, found = scan_conversations(parsed.conversations, setting == "redact")
        parsed = dataclasses.replace(parsed, conversations=conversations)
    summary = summarize(found, parsed.path.replace("\\", "/").rsplit("/", 1)[-1], setting)
    summary["findings"] = [dataclasses.asdict(f) for f in found[:FINDINGS_LISTED]]
    if not found:
        return parsed, summary
    if setting == "refuse":
        message = f"sensitive data, which {ref('sensitive_data', 'refuse')} does not train on: {sentence(summary)}"
        message += f"; remove them, or train on placeholders with {ref('sensitive_data', 'redact')}"
        parsed.errors = [*parsed.errors, Problem(found[0].line, SENSITIVE_DATA, message)]
        return parsed, summary
    if setting == "redact":
        message = f"{sentence(summary)}: each is replaced by a placeholder (<EMAIL>, ...) before tokenizing"
    else:
        message = (
            f"sensitive data, trained on as it is: {sentence(summary)}; a model learns to say what its targets hold: "
            f"{ref('sensitive_data', 'redact')} replaces each with a placeholder, {ref('sensitive_data', 'refuse')} "
            "stops before planning"
        )
    parsed.warnings = [*parsed.warnings, Problem(found[0].line, SENSITIVE_DATA, message)]
    return parsed, summary
