"""A varied-length support export for the long-conversation tests (issue 26), generated, not committed.

    lines = support_export()   # 40 conversations: quick questions, explanations, multi-turn threads,
                               # two threads longer than the toy model's 4,096-token context window, and one
                               # reply that is longer than the window by itself

Deterministic (no randomness): the tests compare the same summary across validate, plan, train and a job.
"""

from __future__ import annotations

import json
from pathlib import Path

SYSTEM = (
    "You are the support assistant of Brightside. Answer precisely; give numbered steps when the customer must act."
)
TOPICS = ["the router", "an invoice", "a refund", "the password", "a slow connection", "the mobile app", "a delivery"]
LONG_LINES = (9, 23)  # the two threads longer than the window (1-based lines)
HUGE_REPLY_LINE = 31  # the reply longer than the window by itself


def _reply(topic: str, turn: int, steps: int) -> str:
    body = " ".join(f"{n}. Check {topic} again and restart it, then wait a minute." for n in range(1, steps + 1))
    return f"About {topic} (reply {turn}): {body}"


def _conversation(i: int) -> dict:
    topic = TOPICS[i % len(TOPICS)]
    messages = [{"role": "system", "content": SYSTEM}] if i % 2 == 0 else []
    line = i + 1
    if line in LONG_LINES:
        turns, steps = 14, 22  # ~14 x 430 tokens with the test toy tokenizer: over its 4,096-token window
    elif line == HUGE_REPLY_LINE:
        turns, steps = 1, 280  # ~5,000 tokens in one reply
    else:
        turns, steps = 1 + i % 4, 1 + (i * 5) % 6  # quick answers and threads of 2-4 turns
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn + 1} of customer {i} about {topic}?"})
        messages.append({"role": "assistant", "content": _reply(topic, turn + 1, steps)})
    return {"messages": messages}


def support_export() -> list[str]:
    return [json.dumps(_conversation(i)) for i in range(40)]


def write_support_export(path: Path) -> Path:
    path.write_text("\n".join(support_export()) + "\n", encoding="utf-8")
    return path
