"""Issue 26: a varied-length export with conversations longer than the model's window trains everywhere, and
validate, plan and the library call say what was split and dropped in the same words; --strict fails each,
naming FILE:LINE. (The service's job: tests/service/test_api_sdk.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared export generator

from long_export import HUGE_REPLY_LINE, LONG_LINES, write_support_export  # noqa: E402

import finetune  # noqa: E402
from finetune.commands.cli import main  # noqa: E402
from finetune.settings.config import RunConfig  # noqa: E402
from finetune.settings.errors import UserError  # noqa: E402

SUMMARY_CODES = ("conversations_split", "truncated_examples", "dropped_examples")


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    return write_support_export(tmp_path_factory.mktemp("long") / "support.jsonl")


def _json(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def _summary(warnings: list[dict]) -> list[tuple[str, str]]:
    return [(w["code"], w["message"]) for w in warnings if w["code"] in SUMMARY_CODES]


def test_validate_plan_and_train_give_one_summary(export, toy_model, tmp_path, capsys):
    code, validated = _json(capsys, ["validate", str(export), "--model", str(toy_model), "--json"])
    assert code == 0 and validated["ok"], validated["errors"]  # over-long is not an error any more
    summary = _summary(validated["warnings"])
    assert [c for c, _ in summary] == ["conversations_split", "dropped_examples"]
    split, dropped = (message for _, message in summary)
    assert split.startswith("2 conversations longer than 4,096 tokens split into ")
    assert split.endswith(": support.jsonl:9, support.jsonl:23") and LONG_LINES == (9, 23)
    assert dropped.startswith("1 record dropped") and dropped.endswith(f": support.jsonl:{HUGE_REPLY_LINE}")

    code, plan = _json(capsys, ["plan", str(export), "--model", str(toy_model), "--json"])
    assert code == 0 and _summary(plan["warnings"]) == summary
    assert plan["max_seq_len"] == 4096 and "context window" in plan["auto"]["max_seq_len"]
    assert plan["split_at"] == ["support.jsonl:9", "support.jsonl:23"] and plan["dropped_lines"] == [HUGE_REPLY_LINE]
    assert plan["max_record_tokens"] <= 4096

    config = RunConfig(data=str(export), model=str(toy_model), out=str(tmp_path / "run"), max_steps=1,
                       batch_size=2, val_fraction=0)  # fmt: skip
    result = finetune.train(config)
    assert _summary(result.plan.warnings) == summary and result.report["steps_taken"] == 1
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["split_records"] == plan["split_records"]


def test_strict_fails_each_naming_file_and_line(export, toy_model, tmp_path, capsys):
    code, validated = _json(capsys, ["validate", str(export), "--model", str(toy_model), "--strict", "--json"])
    assert code == 1
    assert [(e["code"], e["line"]) for e in validated["errors"]] == [("too_long", line) for line in (9, 23, 31)]
    assert not _summary(validated["warnings"])

    assert main(["plan", str(export), "--model", str(toy_model), "--strict"]) == 1
    error = capsys.readouterr().err
    assert "support.jsonl:9, support.jsonl:23, support.jsonl:31" in error and "--strict" in error

    config = RunConfig(data=str(export), model=str(toy_model), out=str(tmp_path / "strict"), strict=True)
    with pytest.raises(UserError, match="support.jsonl:9"):
        finetune.train(config)
    assert not (tmp_path / "strict" / "plan.json").exists()
