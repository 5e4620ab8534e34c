"""finetune eval: answers side by side, with a word-overlap number that is what it says."""

from __future__ import annotations

import json
from pathlib import Path

from finetune.commands.cli import main
from finetune.commands.eval import token_f1

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_token_f1():
    assert token_f1("the cat sat", "the cat sat") == 1.0
    assert token_f1("dog", "the cat") == 0.0
    assert abs(token_f1("the cat", "the cat sat down") - 2 * (1 * 0.5) / 1.5) < 1e-9


def test_eval_json_with_base_and_tuned(toy_model, capsys):
    # the base model stands in for a "tuned" full model folder: the command must load either kind
    args = ["eval", str(EXAMPLES / "test.jsonl"), "--model", str(toy_model), "--tuned", str(toy_model)]
    assert main([*args, "--limit", "2", "--max-new-tokens", "5", "--json", "--marker", "Hi"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["examples"] == 2 and set(result["summary"]) == {"base", "tuned"}
    assert result["rows"][0]["base"] == result["rows"][0]["tuned"]  # same weights, greedy: same answer
    assert {"prompt", "reference", "line"} <= result["rows"][0].keys()


def test_retention_only_goes_with_retention(tmp_path, capsys):
    """`--retention-only` (what a service evaluation of the retention check alone runs) without `--retention`: one line."""
    assert main(["eval", str(tmp_path), "--retention-only"]) == 1
    assert "--retention-only goes with --retention" in capsys.readouterr().err
