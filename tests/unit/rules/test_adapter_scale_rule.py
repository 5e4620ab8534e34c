"""Adapter scale: the rule that picks the scale from measurements, the setting's checks, and its resume policy."""

from __future__ import annotations

import pytest

from finetune.rules.adapter_scale import (
    ABSOLUTE_TOLERANCE,
    GRID,
    NO_VALIDATION,
    RELATIVE_TOLERANCE,
    choose_scale,
    plan_reason,
    tolerance,
)
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import check_resume, identities
from finetune.settings.registry import by_api_key, hyperparameter_schema


def _measured(val: dict[float, float], general: dict[float, float] | None = None) -> list[dict]:
    general = general or {}
    return [{"alpha": a, "val_loss": v, "general_loss": general.get(a)} for a, v in sorted(val.items())]


def test_the_smallest_scale_within_ten_percent_of_the_full_adapters_loss():
    measured = _measured({0.0: 3.0, 0.25: 1.6, 0.5: 1.2, 0.75: 1.09, 1.0: 1.0}, {0.0: 0.5, 0.75: 0.8, 1.0: 1.1})
    choice = choose_scale(measured)
    assert choice.value == 0.75  # 1.09 <= 1.1; 1.2 is not
    assert "10%" in choice.reason and "1.1" in choice.reason


def test_near_zero_the_band_is_an_absolute_fiftieth_of_a_nat():
    assert tolerance(0.018) == ABSOLUTE_TOLERANCE and tolerance(2.0) == pytest.approx(RELATIVE_TOLERANCE * 2.0)
    # SmolLM2's demo run with replay (bench/AUTO.md): 0.75 costs 0.016 nats, 0.5 far more
    measured = _measured({0.25: 0.905, 0.5: 0.225, 0.75: 0.0346, 1.0: 0.0182}, {0.5: 0.406, 0.75: 0.458, 1.0: 0.573})
    choice = choose_scale(measured)
    assert choice.value == 0.75  # 0.0346 <= 0.0182 + 0.02; a 10% band (0.0200) would have kept 1
    assert "0.02 nats per token" in choice.reason
    assert choose_scale(_measured({0.25: 0.2, 0.5: 0.039, 0.75: 0.02, 1.0: 0.018})).value == 0.75  # 0.039 > 0.038


def test_the_base_is_measured_for_reference_but_never_chosen():
    measured = _measured({0.0: 1.0, 0.25: 5.0, 0.5: 5.0, 0.75: 5.0, 1.0: 1.0})
    assert choose_scale(measured).value == 1.0
    assert 0.0 not in GRID


def test_only_the_full_adapter_keeps_the_fit():
    choice = choose_scale(_measured({0.25: 3.0, 0.5: 2.0, 0.75: 1.5, 1.0: 0.3}))
    assert choice.value == 1.0 and "only the full adapter keeps the fit" in choice.reason


def test_a_scale_that_buys_nothing_on_the_general_probe_is_not_taken():
    measured = _measured({0.25: 5.0, 0.5: 1.05, 0.75: 1.0, 1.0: 1.0}, {0.5: 1.3, 0.75: 1.25, 1.0: 1.2})
    choice = choose_scale(measured)
    assert choice.value == 1.0 and "does not lower the loss on the general probe" in choice.reason


def test_without_a_general_probe_the_validation_loss_decides():
    assert choose_scale(_measured({0.25: 5.0, 0.5: 1.05, 0.75: 1.0, 1.0: 1.0})).value == 0.5


def test_without_a_validation_loss_the_adapter_stays_as_trained():
    assert choose_scale([{"alpha": 1.0, "val_loss": None, "general_loss": 1.0}]).value == 1.0
    assert plan_reason(0, None, None) == NO_VALIDATION
    said = plan_reason(31, 4_000, 12.0)
    assert "chosen after training" in said and "5 forward passes over the 31 validation records" in said
    assert "20,000 tokens" in said and "about 12 s" in said


def test_the_setting_takes_a_scale_auto_or_off():
    assert RunConfig().adapter_scale == "auto" and RunConfig(adapter_scale=False).adapter_scale == "off"  # YAML's off
    assert (
        RunConfig(adapter_scale="0.5").adapter_scale == 0.5 and RunConfig(adapter_scale="auto").adapter_scale == "auto"
    )
    for bad in (0, 1.5, -0.5):
        with pytest.raises(UserError, match="above 0 and at most 1"):
            RunConfig(adapter_scale=bad)
    with pytest.raises(UserError, match="a number or 'auto', or 'off'"):
        RunConfig(adapter_scale="half")


def test_full_fine_tuning_refuses_a_scale_and_takes_auto_as_nothing_to_do():
    with pytest.raises(UserError, match="trains every weight and has none"):
        RunConfig(method="full", adapter_scale=0.5)
    with pytest.raises(UserError, match="trains every weight and has none"):
        RunConfig(method="dpo", base_method="full", adapter_scale=0.5)
    assert RunConfig(method="full", adapter_scale="auto").adapter_scale == "auto"  # the run says it does nothing


def test_callers_of_the_api_and_the_dashboard_see_it():
    assert by_api_key()["adapter_scale"].label == "Adapter scale"
    prop = hyperparameter_schema()["properties"]["adapter_scale"]
    assert prop["default"] == "auto" and prop["examples"] == ["auto", "off"] and prop["x-finetune"]["when"] == "lora"


def test_resume_refuses_a_change_of_the_scale():
    assert not identities()["adapter_scale"].allowable  # in every checkpoint's fingerprint
    saved = {"adapter_scale": "off"}
    with pytest.raises(UserError, match="adapter scale changed"):
        check_resume(saved, {"adapter_scale": "auto"}, "adapter_scale", "checkpoint-10")
    assert check_resume(saved, {"adapter_scale": "off"}, None, "checkpoint-10") == []
