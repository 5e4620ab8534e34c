"""A deterministic chat data set with realistic, varied lengths, for the throughput benchmark.

    python bench/data.py bench/data/bench.jsonl [--conversations 200] [--seed 0]

Real support and assistant logs are not uniform: most replies are short, some are long
(step-by-step answers, code), some conversations run several turns, about half carry a system
prompt, and now and then a user pastes a log or a code snippet. Padding waste and packing gains
depend entirely on that spread, so the generator reproduces it from a seed, without any download:

    kind          share   turns   reply words        user words
    quick         40 %    1       5-40               5-30
    explain       25 %    1       120-380            10-45 (+ a paste in 1 of 3)
    multi         25 %    2-4     15-160 each        5-35 each
    long-thread   10 %    4-6     40-200 each        5-60 each (+ a paste)

Conversations are trimmed, turn by turn, to stay under MAX_WORDS so every record fits the
benchmark's max sequence length (1024 tokens) without truncation on either side.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

MAX_WORDS = 560  # ~1.6 tokens a word with a BPE trained on this text: stays under 1024 tokens

_PRODUCTS = [
    "Home 200",
    "Gamer 800",
    "Fibre Max",
    "Mobile Lite",
    "Cloud Backup",
    "the router",
    "the app",
    "Smart TV box",
]
_TOPICS = [
    "billing",
    "an invoice",
    "a refund",
    "the password",
    "two-factor login",
    "a slow connection",
    "an outage",
    "a plan change",
    "a delivery",
    "the data export",
    "an API key",
    "a failed payment",
    "the mobile app",
]
_CITIES = ["Stonebridge", "Ashford", "Millbrook", "Eastport", "Riverton", "Oakhaven", "Westfield", "Lakemont"]
_NAMES = ["Sam", "Ana", "Yusuf", "Mei", "Tom", "Priya", "Lars", "Chloe", "Ibrahim", "Sofia", "Kenji", "Grace"]
_VERBS = [
    "check",
    "restart",
    "update",
    "reset",
    "open",
    "confirm",
    "review",
    "download",
    "enable",
    "disable",
    "move",
    "cancel",
    "renew",
    "verify",
    "compare",
    "schedule",
    "export",
    "import",
    "rename",
    "replace",
]
_OBJECTS = [
    "your account settings",
    "the billing page",
    "the modem",
    "the latest invoice",
    "the security tab",
    "the order history",
    "your payment method",
    "the network cable",
    "the firmware",
    "the backup folder",
    "the notification settings",
    "the support ticket",
    "the delivery address",
    "the usage report",
    "the API dashboard",
    "the sign-in page",
    "the family plan",
    "the Wi-Fi channel",
    "the parental controls",
]
_ADVERBS = ["first", "then", "after that", "if that does not help", "once this is done", "finally", "meanwhile"]
_FILLER = [
    "This usually takes a few minutes.",
    "You will get an email when it is done.",
    "Nothing else changes.",
    "Your data stays safe during the change.",
    "The charge appears on your next bill.",
    "No action is needed.",
    "Most customers see the result right away.",
    "It can take up to 24 hours in rare cases.",
    "We keep a copy for 30 days.",
    "The team reviews these requests every morning.",
]
_ASKS = [
    "How do I {verb} {obj}?",
    "Can you help me {verb} {obj}?",
    "Why can't I {verb} {obj}?",
    "Is it possible to {verb} {obj} from {product}?",
    "I tried to {verb} {obj} but it failed.",
    "What happens if I {verb} {obj}?",
    "My {topic} question: should I {verb} {obj}?",
    "Hi, quick one about {topic} in {city}.",
    "{product} stopped working after I tried to {verb} {obj}.",
]
_SYSTEMS = [
    "You are the support assistant of Brightside. Be friendly, precise and brief.",
    "Answer customer questions for Brightside Support. Always give numbered steps when the user must act, "
    "never invent order numbers, and close with an offer to help further.",
    "You help engineers use the Brightside API. Prefer short code examples in Python. Mention rate limits "
    "when relevant and never print secrets.",
    "You are a careful assistant for the billing team. Quote amounts with two decimals and the currency. "
    "If a refund is above 500.00 EUR, say that a supervisor will confirm it within two business days.",
]
_CODE = [
    "import requests",
    "resp = requests.get(f'{BASE}/v1/orders/{order_id}', headers={'Authorization': f'Bearer {key}'})",
    "resp.raise_for_status()",
    "for item in resp.json()['items']:",
    "    print(item['sku'], item['quantity'], item['status'])",
    "if resp.status_code == 429:",
    "    time.sleep(int(resp.headers.get('Retry-After', '5')))",
    "data = {'plan': 'gamer-800', 'starts': 'next_billing_date'}",
    "client.post('/v1/subscriptions/change', json=data, timeout=10)",
]
_LOG = [
    "2024-03-{d:02d} 10:{m:02d}:12 ERROR conn reset by peer (code 104) on wan0",
    "2024-03-{d:02d} 10:{m:02d}:15 WARN dhcp lease renew failed, retry in 30s",
    "2024-03-{d:02d} 10:{m:02d}:47 INFO link up 940/940 Mbps full duplex",
    "2024-03-{d:02d} 10:{m:02d}:48 ERROR dns timeout resolving api.brightside.example",
    "2024-03-{d:02d} 10:{m:02d}:59 INFO firmware 4.2.{m} check: up to date",
]


def _fill(rng: random.Random, template: str) -> str:
    return template.format(
        verb=rng.choice(_VERBS),
        obj=rng.choice(_OBJECTS),
        product=rng.choice(_PRODUCTS),
        topic=rng.choice(_TOPICS),
        city=rng.choice(_CITIES),
    )


def _sentence(rng: random.Random) -> str:
    """One support-style sentence: an instruction, a fact, or a reference number."""
    kind = rng.random()
    if kind < 0.45:
        return f"{rng.choice(_ADVERBS).capitalize()}, {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
    if kind < 0.75:
        return rng.choice(_FILLER)
    if kind < 0.9:
        return f"Your reference is BR-{rng.randrange(100000, 999999)} for {rng.choice(_TOPICS)}."
    return f"In {rng.choice(_CITIES)}, {rng.choice(_PRODUCTS)} is covered by the {rng.choice(_TOPICS)} policy."


def _words(text: str) -> int:
    return len(text.split())


def _prose(rng: random.Random, words: int) -> str:
    out: list[str] = []
    while sum(_words(s) for s in out) < words:
        out.append(_sentence(rng))
    return " ".join(out)


def _reply(rng: random.Random, words: int, name: str) -> str:
    """A reply of about `words` words: long ones get paragraphs, numbered steps and sometimes code."""
    if words < 60:
        return f"Hi {name}! " + _prose(rng, words)
    parts = [f"Hi {name}, thanks for the details.", _prose(rng, words // 4)]
    steps = [f"{i}. {_sentence(rng)}" for i in range(1, 2 + words // 40)]
    parts.append("Here is what to do:\n" + "\n".join(steps))
    if rng.random() < 0.35:
        code = "\n".join(rng.sample(_CODE, k=min(len(_CODE), 3 + words // 80)))
        parts.append(f"```python\n{code}\n```")
    used = sum(_words(p) for p in parts)
    if used < words:
        parts.append(_prose(rng, words - used))
    parts.append("Is there anything else I can help with?")
    return "\n\n".join(parts)


def _user(rng: random.Random, words: int, paste: bool) -> str:
    text = " ".join(_fill(rng, rng.choice(_ASKS)) for _ in range(max(1, words // 9)))
    if paste:
        d, lines = rng.randrange(1, 29), rng.randrange(4, 14)
        log = "\n".join(rng.choice(_LOG).format(d=d, m=rng.randrange(60)) for _ in range(lines))
        text += f"\nHere is the log:\n{log}"
    return text


def generate_conversation(rng: random.Random) -> dict:
    """One conversation in the chat format {"messages": [{"role", "content"}, ...]}."""
    name = rng.choice(_NAMES)
    kind = rng.random()
    messages: list[dict] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(_SYSTEMS)})
    if kind < 0.40:  # quick question, short answer
        turns = [(rng.randint(5, 30), False, rng.randint(5, 40))]
    elif kind < 0.65:  # one question, a long explanation
        turns = [(rng.randint(10, 45), rng.random() < 0.33, rng.randint(120, 380))]
    elif kind < 0.90:  # a few back-and-forth turns
        turns = [(rng.randint(5, 35), False, rng.randint(15, 160)) for _ in range(rng.randint(2, 4))]
    else:  # a long thread with a pasted log
        turns = [(rng.randint(5, 60), i == 0, rng.randint(40, 200)) for i in range(rng.randint(4, 6))]
    total = sum(_words(m["content"]) for m in messages)
    for user_words, paste, reply_words in turns:
        user, reply = _user(rng, user_words, paste), _reply(rng, reply_words, name)
        if total + _words(user) + _words(reply) > MAX_WORDS and len(messages) > 1:
            break  # trim whole turns: the conversation still ends with an assistant reply
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        total += _words(user) + _words(reply)
    return {"messages": messages}


def generate_conversations(n: int = 200, seed: int = 0) -> list[dict]:
    rng = random.Random(f"finetune-bench-{seed}")
    return [generate_conversation(rng) for _ in range(n)]


def write_dataset(path: str | Path, n: int = 200, seed: int = 0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(c, ensure_ascii=False) for c in generate_conversations(n, seed)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(Path(__file__).parent / "data" / "bench.jsonl"))
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_dataset(args.out, args.conversations, args.seed))


if __name__ == "__main__":
    main()
