"""Sensitive values in one text: e-mail addresses, phone numbers, payment cards, IBANs and secrets (docs/sensitive-data.md).

    spans = find_spans(text)                  # [Span(kind, start, end, detector)], in order, none overlapping
    text = redact_text(text, spans)           # each value replaced by its kind's placeholder (<EMAIL>, <CARD>, ...)

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
A Span says where a value is and what kind it is, never the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache

KINDS = ("email", "phone", "card", "iban", "secret")
PLACEHOLDERS = {"email": "<EMAIL>", "phone": "<PHONE>", "card": "<CARD>", "iban": "<IBAN>", "secret": "<SECRET>"}
NAMES = {"email": "e-mail address", "phone": "phone number", "card": "payment card number", "iban": "IBAN",
         "secret": "secret"}  # fmt: skip
PHONE_REGIONS = ("US", "GB")  # national-form numbers of these regions; international (+CC ...) ones from anywhere
# a phone number has 7 digits or more, a few separators apart at most: a text without such a run holds none, and the
# matcher (the slow part of a scan) is not run on it
_PHONE_DIGITS = re.compile(r"\d(?:[\s().\-/]{0,3}\d){6,}")
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


def redact_text(text: str, spans: list) -> str:
    """`text` with each span (a Span, or anything with its kind, start and end) replaced by its kind's placeholder (<EMAIL>, <PHONE>, <CARD>, <IBAN>, <SECRET>)."""
    for span in sorted(spans, key=lambda s: s.start, reverse=True):
        text = text[: span.start] + PLACEHOLDERS[span.kind] + text[span.end :]
    return text
