"""Plan and Auto for preference tuning: 1-2 epochs, a lower learning rate, beta, each with its reason."""

from __future__ import annotations

import json

import pytest

from finetune.commands.cli import main
from finetune.plan.build import build_plan
from finetune.plan.what_if import what_if_summary
from finetune.settings.config import ConfigError, RunConfig


def _plan(**settings):
    config = RunConfig(**settings)
    return build_plan(config, what_if_summary(config, 400, 200_000))


def test_auto_for_dpo_with_reasons():
    sft, dpo = _plan(), _plan(method="dpo")
    assert dpo.objective == "dpo" and dpo.method == "lora" and sft.objective == "sft"
    assert dpo.epochs == 2 and "preference" in dpo.auto["epochs"] and sft.epochs == 3
    assert (
        dpo.learning_rate == pytest.approx(sft.learning_rate * 0.1) and "supervised rate" in dpo.auto["learning_rate"]
    )
    assert dpo.beta == 0.1 and "beta" in dpo.auto and "beta" not in sft.auto and sft.beta is None
    assert dpo.packing is False and sft.packing is True
    assert _plan(method="dpo", beta=0.3).beta == 0.3 and "beta" not in _plan(method="dpo", beta=0.3).auto
    assert build_plan(RunConfig(method="dpo"), what_if_summary(RunConfig(), 9000, None)).epochs == 1


def test_dpo_on_full_weights():
    plan = _plan(method="dpo", base_method="full", sft_weight=0.5)
    assert plan.method == "full" and plan.lora_rank is None and plan.sft_weight == 0.5
    assert plan.to_dict()["objective"] == "dpo"


@pytest.mark.parametrize(("settings", "flag"), [({"beta": 0}, "--beta"), ({"sft_weight": -1}, "--sft-weight")])
def test_bad_dpo_settings_name_their_flag(settings, flag):
    with pytest.raises(ConfigError, match=flag):
        RunConfig(method="dpo", **settings)


def _prefs(tmp_path):
    lines = [
        {"prompt": f"question {i % 12}", "chosen": f"Hi there! answer {i}", "rejected": f"answer {i}"}
        for i in range(24)
    ]
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_finetune_plan_on_a_preference_file(tmp_path, capsys):
    path = _prefs(tmp_path)
    assert main(["plan", path, "--method", "dpo", "--val-fraction", "0.25"]) == 0
    shown = capsys.readouterr().out
    assert "preference tuning (DPO, beta 0.1)" in shown
    assert "Training   18 pairs (examples) from 9 prompts" in shown and "Validation 6 pairs from 3 prompts" in shown
    assert main(["plan", path, "--method", "dpo", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["objective"] == "dpo" and plan["beta"] == 0.1 and plan["epochs"] == 2


def test_planning_pairs_without_method_dpo_says_so(tmp_path, capsys):
    assert main(["plan", _prefs(tmp_path)]) != 0
    assert "holds preference pairs (chosen/rejected): use it with --method dpo" in capsys.readouterr().err
