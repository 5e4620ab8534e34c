"""Ten kinds of sensitive values planted in a team's data (issue 42): what `sensitive_data: redact` must leave in no
file the product writes. Shared by the command line's test (tests/integration/test_sensitive_train.py) and the job
service's (tests/service/test_sensitive_data.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

PEM_BODY = "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnz"
PLANTED = {
    "email": "jane.doe@example.com",
    "phone (international)": "+44 20 7946 0958",
    "phone (national)": "(415) 555-2671",
    "card (Visa)": "4111 1111 1111 1111",
    "card (Mastercard)": "5555-5555-5555-4444",
    "IBAN (GB)": "GB82 WEST 1234 5698 7654 32",
    "IBAN (DE)": "DE89 3704 0044 0532 0130 00",
    "AWS access key": "AKIAIOSFODNN7EXAMPLE",
    "GitHub token": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "PEM private key": f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----",
}
# what a search of bytes looks for: each value as written, and the PEM block's body (JSON escapes its line breaks)
NEEDLES = {**{kind: value for kind, value in PLANTED.items() if "PEM" not in kind}, "PEM private key": PEM_BODY}
_ROWS = [
    (
        f"Hi, I am {PLANTED['email']}; my card {PLANTED['card (Visa)']} was charged twice.",
        f"Thanks, I wrote to {PLANTED['email']} about card {PLANTED['card (Mastercard)']}.",
    ),
    (
        f"Call me on {PLANTED['phone (international)']} or {PLANTED['phone (national)']}.",
        f"The refund goes to IBAN {PLANTED['IBAN (GB)']} today, or to {PLANTED['IBAN (DE)']}.",
    ),
    ("The deploy fails.", f"Use the key {PLANTED['AWS access key']} and the token {PLANTED['GitHub token']} for now."),
    ("Which key signs the build?", f"This one:\n{PLANTED['PEM private key']}"),
]


def planted_rows(copies: int = 3, plain: int = 12) -> list[dict]:
    """Chat rows: the planted conversations `copies` times over (each copy told apart, so none is a duplicate, and
    some land in every split), then `plain` conversations with nothing to find."""
    rows = []
    for copy in range(copies):
        for user, reply in _ROWS:
            rows.append({"messages": [{"role": "user", "content": f"({copy}) {user}"},
                                      {"role": "assistant", "content": reply}]})  # fmt: skip
    for i in range(plain):
        rows.append({"messages": [{"role": "user", "content": f"How do I reset router {i}?"},
                                  {"role": "assistant", "content": f"Hold its reset button ten seconds, router {i}."}]})  # fmt: skip
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def holding(roots: list[Path], tokenizer=None) -> dict[str, list[str]]:
    """Each planted value -> the files under `roots` whose bytes hold it (and the token cache files whose tokens,
    decoded with `tokenizer`, spell it)."""
    files = sorted({p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()})
    texts = {str(p): p.read_bytes().decode("utf-8", "replace") for p in files}
    if tokenizer is not None:
        for path in files:
            if path.suffix == ".npy" and path.name.startswith("ids"):
                texts[f"{path} (decoded)"] = tokenizer.decode(np.load(path).tolist())
    return {kind: [name for name, text in texts.items() if needle in text] for kind, needle in NEEDLES.items()}
