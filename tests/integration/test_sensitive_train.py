"""`finetune train --sensitive-data redact` end to end on the toy model (docs/sensitive-data.md): it trains on
placeholders, plan.json says how many values were replaced, and nothing the run or the token cache wrote, nor what
it printed, holds a planted value (tests/unit/data/test_sensitive.py has the resume refusal and the rest)."""

from __future__ import annotations

import json

import numpy as np

from finetune.commands.cli import main
from finetune.data.tokenize import load_tokenizer

VALUES = ("jane.doe@example.com", "4111 1111 1111 1111", "GB82 WEST 1234 5698 7654 32", "AKIAIOSFODNN7EXAMPLE")
ROWS = [
    ("My card 4111 1111 1111 1111 was charged twice; I am jane.doe@example.com.", "I wrote to jane.doe@example.com."),
    ("Where does the refund go?", "To IBAN GB82 WEST 1234 5698 7654 32, today."),
    ("The deploy fails.", "Use the key AKIAIOSFODNN7EXAMPLE for now."),
] + [(f"How do I reset router {i}?", f"Hold its reset button ten seconds, router {i}.") for i in range(13)]


def test_redact_trains_on_placeholders_and_writes_no_value(toy_model, tmp_path, capsys):
    data = tmp_path / "support.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": u},
                                                     {"role": "assistant", "content": a}]}) + "\n" for u, a in ROWS))  # fmt: skip
    out, cache = tmp_path / "run", tmp_path / "cache"
    args = ["train", str(data), "--model", str(toy_model), "--out", str(out), "--cache-dir", str(cache)]
    small = ["--max-steps", "2", "--batch-size", "4", "--val-fraction", "0.2", "--sensitive-data", "redact"]
    assert main([*args, *small]) == 0
    printed = capsys.readouterr()
    plan = json.loads((out / "plan.json").read_text())
    assert plan["sensitive_data"] == "redact" and plan["sensitive_found"]["replaced"] == 5
    assert any(w["code"] == "sensitive_data" and w["message"].startswith("5 sensitive value(s) replaced")
               for w in plan["warnings"])  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert report["steps_taken"] == 2
    written = [p for p in list(out.rglob("*")) + list(cache.rglob("*")) if p.is_file()]
    assert any(p.name == "ids.npy" for p in written)  # the tokens trained on are in the cache: none is a value
    texts = [printed.out, printed.err] + [p.read_bytes().decode("utf-8", "replace") for p in written]
    tokenizer = load_tokenizer(str(toy_model))
    (ids,) = [np.load(p) for p in written if p.name == "ids.npy"]
    decoded = tokenizer.decode(ids.tolist())
    assert "<EMAIL>" in decoded and "<IBAN>" in decoded and "<SECRET>" in decoded
    for value in VALUES:
        assert value not in decoded
        assert not any(value in text for text in texts), value
