"""Auto's self-replay rule: on at its measured share for a real base, off for a toy-sized model and for DPO."""

from __future__ import annotations

from finetune.rules.replay import AUTO_RATIO, MIN_PARAMETERS, auto_replay

SMOLLM2_PARAMETERS = 134_515_008
TOY_PARAMETERS = 1_250_432  # the pretrained toy base


def test_a_real_base_rehearses_its_own_answers():
    choice = auto_replay(SMOLLM2_PARAMETERS, general_data=False, objective="sft")
    assert choice.value == AUTO_RATIO > 0 and "answered by the base model itself" in choice.reason


def test_a_toy_sized_model_has_nothing_to_keep():
    choice = auto_replay(TOY_PARAMETERS, general_data=False, objective="sft")
    assert choice.value == 0 and choice.reason.startswith("off: a model of 1.3M parameters")
    assert auto_replay(MIN_PARAMETERS, general_data=False, objective="sft").value == AUTO_RATIO  # the limit is on


def test_a_teams_general_data_is_mixed_in_at_any_size():
    choice = auto_replay(TOY_PARAMETERS, general_data=True, objective="sft")
    assert choice.value == AUTO_RATIO and choice.reason.startswith("your general conversations")


def test_preference_tuning_leaves_replay_off():
    assert auto_replay(SMOLLM2_PARAMETERS, general_data=False, objective="dpo").value == 0


def test_an_unknown_size_counts_as_a_real_model():  # a plan without the model's config at hand
    assert auto_replay(None, general_data=False, objective="sft").value == AUTO_RATIO
