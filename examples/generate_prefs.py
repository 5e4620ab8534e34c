"""Generate the bundled preference set: the team's answer preferred over a generic one.

Each pair is one conversation of examples/train.jsonl (the training split only: test.jsonl stays unseen),
cut before its last assistant reply. The chosen answer is the team's reply (the house style: greeting,
short answer, sign-off); the rejected one is a generic reply without the house style, picked from a few
templates with a seeded generator, so running this script again writes a byte-identical file.

    python examples/generate_prefs.py            # writes examples/prefs.jsonl
    python examples/generate_prefs.py OUT.jsonl

The file is in OpenAI's preference format: {"input": {"messages": [...]}, "preferred_output": [...],
"non_preferred_output": [...]}.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 15
GENERIC_REPLIES = [
    "Thank you for contacting us. Please check our website or call customer service for help with your request.",
    "We are sorry for any inconvenience. Our team will look into this and get back to you as soon as possible.",
    "Please restart your device and try again. If the problem continues, contact customer service.",
    "Thanks for your message. You can find more information about this in the help section of our website.",
    "Your request has been received. A member of our team will contact you within a few business days.",
]


def pairs(conversations: list[dict], seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for conversation in conversations:
        messages = [{"role": m["role"], "content": m["content"]} for m in conversation["messages"]]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        out.append(
            {
                "input": {"messages": messages[:last]},
                "preferred_output": [messages[last]],
                "non_preferred_output": [{"role": "assistant", "content": rng.choice(GENERIC_REPLIES)}],
            }
        )
    return out


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else HERE / "prefs.jsonl"
    lines = (HERE / "train.jsonl").read_text(encoding="utf-8").splitlines()
    conversations = [json.loads(line) for line in lines if line.strip()]
    text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs(conversations))
    out.write_text(text, encoding="utf-8")
    print(f"wrote {len(conversations)} pairs to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
