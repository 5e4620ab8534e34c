"""Ten kinds of sensitive values planted in a team's data (issue 42), and values in the shapes an attacker would
choose (issue 47: JSON numbers in a tool call's arguments, given as an object and as a JSON string, nested, as an
object's key, in a tool schema, an e-mail address split over two content parts): what `sensitive_data: redact` must
leave in no file the product writes. Shared by the command line's test (tests/integration/test_sensitive_train.py)
and the job service's (tests/service/test_sensitive_data.py)."""

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
# issue 47: values that are not JSON strings, or not whole in one string (each digit run as JSON writes the number)
STRUCTURED = {
    "card as a JSON number": 4012888888881881,
    "phone as a JSON number": 14155552671,
    "card nested in the arguments": 5105105105105100,
    "card in a JSON-string argument": 4222222222222,
    "phone in a JSON-string argument": 16505550123,
    "e-mail as an argument's key": "ops.lead@example.net",
    "e-mail in a tool schema": "billing.desk@example.org",
    "card as a tool schema's default": 4000056655665556,
    "e-mail as a message's name": "agent.desk@example.com",
}
SPLIT_EMAIL = ("jane.roe@exa", "mple.org")  # two content parts: a reader joins them into one address
# what a search of bytes looks for: each value as written, and the PEM block's body (JSON escapes its line breaks)
NEEDLES = {**{kind: value for kind, value in PLANTED.items() if "PEM" not in kind}, "PEM private key": PEM_BODY}
NEEDLES |= {kind: str(value) for kind, value in STRUCTURED.items()}
NEEDLES |= {"split e-mail (as written)": SPLIT_EMAIL[0], "split e-mail (joined)": "".join(SPLIT_EMAIL)}
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


def structured_row(copy: int) -> dict:
    """A tool-calling conversation whose values are numbers, keys, schema fields and split text parts (issue 47)."""
    s = STRUCTURED
    arguments = {"card": s["card as a JSON number"], "phone": s["phone as a JSON number"], "verified": True,
                 "billing": {"backup": [s["card nested in the arguments"]]}, "notify": {s["e-mail as an argument's key"]: True}}  # fmt: skip
    as_string = json.dumps({"card": s["card in a JSON-string argument"], "phone": s["phone in a JSON-string argument"]})
    calls = [{"id": f"call_{copy}a", "type": "function", "function": {"name": "update_contact", "arguments": arguments}},
             {"id": f"call_{copy}b", "type": "function", "function": {"name": "update_contact", "arguments": as_string}}]  # fmt: skip
    schema = {"type": "function", "function": {"name": "update_contact", "description": f"Escalate to {s['e-mail in a tool schema']}",
              "parameters": {"type": "object", "properties": {"card": {"type": "integer", "default": s["card as a tool schema's default"]}}}}}  # fmt: skip
    parts = [
        {"type": "text", "text": f"({copy}) Write to me at {SPLIT_EMAIL[0]}"},
        {"type": "text", "text": f"{SPLIT_EMAIL[1]} today."},
    ]
    return {"messages": [{"role": "user", "content": parts, "name": s["e-mail as a message's name"]},
                         {"role": "assistant", "content": "", "tool_calls": calls},
                         {"role": "tool", "tool_call_id": f"call_{copy}a", "content": "updated"},
                         {"role": "tool", "tool_call_id": f"call_{copy}b", "content": "updated"},
                         {"role": "assistant", "content": f"Done ({copy}): your contact details are updated."}],
            "tools": [schema]}  # fmt: skip


def planted_rows(copies: int = 3, plain: int = 12) -> list[dict]:
    """Chat rows: the planted conversations `copies` times over (each copy told apart, so none is a duplicate, and
    some land in every split; the structured one among them), then `plain` conversations with nothing to find."""
    rows = []
    for copy in range(copies):
        for user, reply in _ROWS:
            rows.append({"messages": [{"role": "user", "content": f"({copy}) {user}"},
                                      {"role": "assistant", "content": reply}]})  # fmt: skip
        rows.append(structured_row(copy))
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
