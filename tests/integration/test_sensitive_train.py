"""`finetune train --sensitive-data redact` end to end on the toy model (docs/sensitive-data.md): it trains on
placeholders, plan.json says how many values were replaced, and nothing the run or the token cache wrote, nor what
it printed, holds a planted value (tests/unit/data/test_sensitive.py has the resume refusal and the rest)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from planted_values import NEEDLES, PLANTED, holding, planted_rows, structured_row, write_rows

from finetune.commands.cli import main
from finetune.data.tokenize import load_tokenizer

VALUES = ("jane.doe@example.com", "4111 1111 1111 1111", "GB82 WEST 1234 5698 7654 32", "AKIAIOSFODNN7EXAMPLE")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
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


def test_redact_leaves_no_planted_value_in_any_file_the_run_writes(toy_model, tmp_path, monkeypatch, capsys):
    """Issue 42: ten kinds of values, a held-out test split and replay on (the team's own general conversations),
    and lines --skip-invalid leaves out: the run folder (train.jsonl, test.jsonl, replay/train.jsonl and
    replay/val.jsonl) and the whole cache root hold none of them, nor do the tokens trained on; the plan names the
    file as the user gave it, and says the test split holds placeholders too."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FINETUNE_CACHE", str(cache))
    data = write_rows(tmp_path / "support.jsonl", planted_rows(copies=3, plain=12))
    _add_invalid_lines(data)  # copied into train.jsonl (and test.jsonl) as they are, but for their values
    general = write_rows(tmp_path / "general.jsonl", planted_rows(copies=1, plain=6))
    out = tmp_path / "run"
    args = ["train", str(data), "--model", str(toy_model), "--out", str(out), "--sensitive-data", "redact"]
    args += ["--test-fraction", "0.2", "--general-data", str(general), "--val-fraction", "0.2", "--skip-invalid"]
    assert main([*args, "--max-steps", "2", "--batch-size", "4"]) == 0
    printed = capsys.readouterr()
    assert {"train.jsonl", "test.jsonl"} <= {p.name for p in out.iterdir()}
    assert {p.name for p in (out / "replay").iterdir()} >= {"train.jsonl", "val.jsonl"}
    found = holding([out, cache], load_tokenizer(str(toy_model)))
    assert found == {kind: [] for kind in NEEDLES}, found
    assert not any(needle in printed.out + printed.err for needle in NEEDLES.values())

    plan = json.loads((out / "plan.json").read_text())
    (warning,) = [w["message"] for w in plan["warnings"] if w["code"] == "sensitive_data"]
    assert "support.jsonl lines" in warning and "train.jsonl" not in warning  # the file the user gave, its lines
    assert "test split" in warning  # the plan says where the placeholders are: every copy, the test split too
    assert "<EMAIL>" in (out / "test.jsonl").read_text() and "<CARD>" in (out / "replay" / "train.jsonl").read_text()


def _add_invalid_lines(path) -> None:
    """Three lines --skip-invalid leaves out, each holding values: an unknown role, a line that is not JSON, and the
    structured conversation (numbers in arguments, a split address) with a role no reader knows."""
    invalid = structured_row(9)
    invalid["messages"][-1]["role"] = "agent"
    with path.open("a") as handle:
        handle.write(f'{{"messages": [{{"role": "customer", "content": "{PLANTED["email"]}"}}]}}\n')
        handle.write(f"not JSON: card {PLANTED['card (Visa)']}, key {PLANTED['AWS access key']}\n")
        handle.write(json.dumps(invalid) + "\n")


@pytest.mark.parametrize("kind", ["conversations", "preference pairs"])
def test_redact_quotes_skipped_lines_with_placeholders(toy_model, tmp_path, kind):
    """OUT/skipped.jsonl quotes each line --skip-invalid left out, and the token cache keeps them: with redact,
    with placeholders (issue 42), for conversations and for preference pairs (--method dpo) alike."""
    if kind == "conversations":
        data, method = write_rows(tmp_path / "support.jsonl", planted_rows(copies=1, plain=12)), []
    else:
        data, method = tmp_path / "prefs.jsonl", ["--method", "dpo"]
        data.write_text("".join(EXAMPLES.joinpath("prefs.jsonl").read_text().splitlines(keepends=True)[:16]))
    valid = len(data.read_text().splitlines())
    _add_invalid_lines(data)
    out, cache = tmp_path / "run", tmp_path / "cache"
    args = ["train", str(data), "--model", str(toy_model), "--out", str(out), "--cache-dir", str(cache), *method]
    assert main([*args, "--max-steps", "1", "--sensitive-data", "redact", "--skip-invalid", "--replay", "off"]) == 0
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [entry["line"] for entry in skipped] == [valid + 1, valid + 2, valid + 3]
    assert "<EMAIL>" in skipped[0]["text"] and "<CARD>" in skipped[1]["text"]
    assert '"card": "<CARD>"' in skipped[2]["text"] and "Write to me at <EMAIL>" in skipped[2]["text"]
    assert holding([out, cache]) == {kind: [] for kind in NEEDLES}
