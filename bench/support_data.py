"""Support-style conversations at scale, for bench/data_path.py: 1k, 10k or 100k lines streamed to disk.

    python bench/support_data.py OUT.jsonl --conversations 100000 [--seed 0]

Each line is one of bench/data.py's conversations (quick questions, long explanations, multi-turn
threads, pasted logs) under the long system prompt a support deployment carries in every exported
conversation: tone, policy and escalation rules. That makes ~2 KB a line, ~200 MB for 100,000, the
size of the export in issue 17. Nothing is committed: the script writes the file where you ask.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data import generate_conversation  # noqa: E402  (bench/data.py, next to this file)

POLICY = (
    "You are the support assistant of Brightside, an internet and mobile provider. Answer in the customer's "
    "language, friendly and precise. Give numbered steps whenever the customer must act. Never invent order "
    "numbers, prices or dates; if you do not know, say so and offer to check. Refunds up to 50 EUR may be "
    "promised; above that, open a ticket for the billing team and give its number. Outages: first check the "
    "status page, then ask for the postcode. Passwords are never asked for or repeated. Escalate to a person "
    "when the customer asks twice or mentions a complaint, cancellation or legal action."
)


def support_conversation(rng: random.Random) -> dict:
    conversation = generate_conversation(rng)
    messages = [m for m in conversation["messages"] if m["role"] != "system"]
    return {"messages": [{"role": "system", "content": POLICY}, *messages]}


def write_support_data(path: str | Path, conversations: int, seed: int = 0) -> Path:
    """Write `conversations` lines to `path` (streamed: memory stays flat whatever the size)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"finetune-support-{seed}")
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(conversations):
            out.write(json.dumps(support_conversation(rng), ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_support_data(args.out, args.conversations, args.seed))


if __name__ == "__main__":
    main()
