"""`finetune plan` fills the token cache and `finetune train` then reads it instead of tokenizing again."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from finetune.commands.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("limit", [["--max-seq-len", "512"], []], ids=["given", "auto"])
def test_plan_then_train_tokenizes_once(toy_model, tmp_path, caplog, monkeypatch, limit):
    import finetune.data.prepare as prepare

    cache = tmp_path / "cache"
    data = ["--model", str(toy_model), *limit, "--cache-dir", str(cache)]
    assert main(["plan", str(EXAMPLES / "train.jsonl"), *data, "--json"]) == 0
    assert len([p for p in cache.iterdir() if (p / "ids.npy").exists()]) == 1  # (and the records' whole lengths)

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("train tokenized the data again instead of reading the token cache")

    monkeypatch.setattr(prepare, "tokenize_chunks", no_tokenizing)
    with caplog.at_level(logging.INFO):
        code = main(["train", str(EXAMPLES / "train.jsonl"), *data, "--out", str(tmp_path / "run"),
                     "--max-steps", "1", "--batch-size", "4", "--lr", "1e-4"])  # fmt: skip
    assert code == 0
    assert "token cache" in caplog.text


def test_skip_invalid_writes_skipped_jsonl_on_a_cache_hit_too(toy_model, tmp_path, caplog):
    lines = (EXAMPLES / "train.jsonl").read_text(encoding="utf-8").splitlines()
    lines[2] = '{"messages": [{"role": "user", "content": "cut'  # not JSON: line 3
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["train", str(data), "--model", str(toy_model), "--max-seq-len", "512", "--skip-invalid",
              "--cache-dir", str(tmp_path / "cache"), "--max-steps", "1", "--batch-size", "4"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "first")]) == 0
    with caplog.at_level(logging.INFO):
        assert main([*common, "--out", str(tmp_path / "second"), "--lr", "1e-4"]) == 0
    assert "token cache" in caplog.text
    for run in ("first", "second"):
        skipped = [json.loads(row) for row in (tmp_path / run / "skipped.jsonl").read_text().splitlines()]
        assert [(s["file"], s["line"], s["codes"]) for s in skipped] == [(str(data), 3, ["not_json"])]
        assert json.loads((tmp_path / run / "report.json").read_text())["skipped_lines"] == 1
