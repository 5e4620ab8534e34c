"""One wording of a message, three renderings: the command line's flags, an API caller's keys, the dashboard's labels
(the last is the API's wording turned into labels by the dashboard's script: tests/dashboard)."""

from __future__ import annotations

import pytest

from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.registry import settings
from finetune.settings.wording import AUDIENCE_ENV, ref, render, rendered, settings_named


def test_a_reference_renders_as_the_flag_or_the_api_key():
    text = f"raise {ref('max_seq_len')} to at least 1556"
    assert render(text, "cli") == "raise --max-seq-len to at least 1556"
    assert render(text, "api") == "raise method.supervised.hyperparameters.max_seq_len to at least 1556"
    assert render(text, "api", "dpo") == "raise method.dpo.hyperparameters.max_seq_len to at least 1556"
    assert settings_named(text) == ["max_seq_len"]


def test_every_setting_renders_without_a_flag_for_an_api_caller():
    for spec in settings():
        text = render(ref(spec.name), "api")
        assert "--" not in text and spec.name in settings_named(ref(spec.name))
        if spec.api_key is None and spec.about.api_param is None:
            assert text == f"the server's “{spec.label}” setting"


def test_names_a_caller_knows_by_another_name():
    assert render(ref("lr"), "api") == "method.supervised.hyperparameters.learning_rate_multiplier"
    assert render(ref("epochs"), "api") == "method.supervised.hyperparameters.n_epochs"
    assert render(ref("val_file"), "api") == "validation_file"
    assert render(ref("packing"), "cli") == "--no-packing"  # on by default: the flag there is
    assert render(ref("method", "dpo"), "cli") == "--method dpo"
    assert render(ref("method", "dpo"), "api") == 'method type "dpo"'


def test_a_typo_in_a_setting_name_fails_where_the_message_is_written():
    with pytest.raises(KeyError):
        ref("max_sequence_length")


def test_an_error_keeps_its_wording_for_every_reader():
    with pytest.raises(UserError) as raised:
        RunConfig(max_seq_len=0)
    assert str(raised.value) == "--max-seq-len must be at least 1 or 'auto', got 0"
    assert raised.value.render("api") == (
        "method.supervised.hyperparameters.max_seq_len must be at least 1 or 'auto', got 0"
    )


def test_a_process_started_for_the_service_writes_in_api_terms(monkeypatch):
    monkeypatch.setenv(AUDIENCE_ENV, "api:dpo")
    assert render(ref("beta")) == "method.dpo.hyperparameters.beta"
    assert rendered({"a": [f"raise {ref('beta')}"], "b": 2}) == {"a": ["raise method.dpo.hyperparameters.beta"], "b": 2}
    assert str(UserError(f"raise {ref('beta')}")) == "raise method.dpo.hyperparameters.beta"


def test_an_action_renders_as_the_command_the_route_or_the_dashboard_control():
    from finetune.settings.wording import ACTIONS, act

    text = f"Training needs no change; read the answers ({act('evaluate')}) to judge quality."
    assert render(text, "cli") == "Training needs no change; read the answers (finetune eval) to judge quality."
    api = render(text, "api")
    assert api == (
        "Training needs no change; read the answers (POST /v1/fine_tuning/jobs/{job_id}/evaluations) to judge quality."
    )
    assert settings_named(text) == []  # an action is not a setting: the dashboard highlights no field for it
    assert rendered({"next_step": text}, "api") == {"next_step": api}
    for name, wordings in ACTIONS.items():
        assert set(wordings) == {"cli", "api", "dashboard"}
        assert "finetune" not in wordings["api"] and "--" not in wordings["api"], name  # no command for a caller
        assert "finetune" not in wordings["dashboard"] and "/v1/" not in wordings["dashboard"], name
    with pytest.raises(KeyError):
        act("evaluat")
