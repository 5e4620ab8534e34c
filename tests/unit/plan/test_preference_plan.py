"""Plan and Auto for preference tuning: 1-2 epochs, a lower learning rate, beta, each with its reason."""

from __future__ import annotations

import pytest

from finetune.config import ConfigError, RunConfig
from finetune.plan.plan import build_plan, what_if_summary


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
