"""OpenAI hyperparameters -> RunConfig settings, and the results CSV: no server, no model."""

from __future__ import annotations

import pytest

from finetune.service.workers.events import diagnosis_event, metrics_event, results_csv
from finetune.service.workers.library import SettingsError, settings_from_hyperparameters


def test_openai_names_map_to_run_config():
    settings = settings_from_hyperparameters(
        {"n_epochs": 3, "batch_size": "auto", "learning_rate_multiplier": 2, "lora_rank": 4, "method": "lora"}
    )
    assert settings == {"epochs": 3, "batch_size": "auto", "lr_multiplier": 2, "lora_rank": 4, "method": "lora"}
    assert settings_from_hyperparameters({"learning_rate_multiplier": "auto"}) == {}


def test_the_api_keys_are_generated_from_the_settings_declarations():
    from finetune.service.workers.library import api_settings
    from finetune.settings.registry import settings

    keys = api_settings("supervised")
    assert {"n_epochs", "batch_size", "learning_rate_multiplier", "max_seq_len", "val_fraction"} <= set(keys)
    assert not {"data", "model", "out", "trust_remote_code", "cache_dir", "gpu", "seed"} & set(keys)
    assert api_settings("dpo")["method"].name == "base_method" and keys["method"].name == "method"
    assert all(s.api_key is None or s.api_key in api_settings("dpo") for s in settings())


def test_a_refused_value_names_the_hyperparameter_in_api_terms():
    with pytest.raises(SettingsError) as raised:
        settings_from_hyperparameters({"max_seq_len": 0})
    assert raised.value.param == "max_seq_len"
    assert "method.supervised.hyperparameters.max_seq_len must be at least 1" in str(raised.value)
    assert "--" not in str(raised.value)


@pytest.mark.parametrize(
    "hyper, param",
    [
        ({"data": "/etc/passwd"}, "data"),  # paths, code and prices are the server's
        ({"model": "/somewhere"}, "model"),
        ({"trust_remote_code": True}, "trust_remote_code"),
        ({"out": "/tmp/x"}, "out"),
        ({"price_per_million_tokens": 0}, "price_per_million_tokens"),
        ({"n_epochs": 0}, "n_epochs"),
        ({"learning_rate_multiplier": -1}, "learning_rate_multiplier"),
        ({"no_such_knob": 1}, "no_such_knob"),
    ],
)
def test_refused_hyperparameters_name_the_key(hyper, param):
    with pytest.raises(SettingsError) as raised:
        settings_from_hyperparameters(hyper)
    assert raised.value.param == param


def test_results_csv_has_openai_columns_and_one_row_per_step():
    rows = [{"step": 1, "train_loss": 1.25}, {"step": 2, "train_loss": 0.5, "val_loss": 0.75}]
    assert results_csv(rows).splitlines() == [
        "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy",
        "1,1.25000,,,",
        "2,0.50000,,0.75000,",
    ]
    event = metrics_event(rows[1], 2)
    assert event["type"] == "metrics" and event["data"]["step"] == 2 and event["data"]["full_valid_loss"] == 0.75


def test_the_blamed_key_is_the_bad_one_among_several():
    with pytest.raises(SettingsError) as raised:
        settings_from_hyperparameters({"lora_rank": 4, "batch_size": 8, "n_epochs": 0})
    assert raised.value.param == "n_epochs" and "n_epochs" in str(raised.value)


def test_a_dpo_method_maps_to_a_preference_run():
    settings = settings_from_hyperparameters(
        {"beta": 0.2, "n_epochs": "auto", "method": "full", "sft_weight": 0.5}, "dpo"
    )
    assert settings == {"method": "dpo", "beta": 0.2, "epochs": "auto", "base_method": "full", "sft_weight": 0.5}


@pytest.mark.parametrize(
    "kind, hyper, param",
    [
        ("supervised", {"beta": 0.1}, "beta"),  # DPO's settings need method type "dpo"
        ("supervised", {"method": "dpo"}, "method"),
        ("dpo", {"method": "dpo"}, "method"),
        ("dpo", {"beta": -1}, "beta"),
        ("dpo", {"method": "full", "beta": 0}, "beta"),
    ],
)
def test_refused_preference_settings_name_the_key(kind, hyper, param):
    with pytest.raises(SettingsError) as raised:
        settings_from_hyperparameters(hyper, kind)
    assert raised.value.param == param


def test_the_diagnosis_event_is_info_for_a_healthy_run_and_a_warning_otherwise():
    good = {"diagnosis": {"kind": "good_fit", "message": "Both losses settled.", "next_step": "Ship it."}}
    event = diagnosis_event(good)
    assert event["level"] == "info" and event["message"] == "Diagnosis (good_fit): Both losses settled. Ship it."
    assert diagnosis_event({"diagnosis": {"kind": "healthy_preference", "message": "ok"}})["level"] == "info"
    assert diagnosis_event({"diagnosis": {"kind": "overfitting", "message": "Rising."}})["level"] == "warn"
    assert diagnosis_event({"diagnosis": {}}) is None and diagnosis_event({}) is None
