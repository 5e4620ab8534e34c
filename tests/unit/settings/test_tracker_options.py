"""--report-to and --tracker-options: checked once, in RunConfig, without importing any tracker's library."""

from __future__ import annotations

import importlib.util
import json

import pytest

from finetune.commands.cli import main
from finetune.settings.config import ConfigError, RunConfig
from finetune.settings.tracker_options import check_installed, parse_report_to, tracker_names


def test_report_to_is_a_comma_list_of_known_trackers_normalised():
    assert parse_report_to("TensorBoard, mlflow,,mlflow") == "tensorboard,mlflow"
    assert parse_report_to(None) is None and parse_report_to("none") is None and parse_report_to(" ") is None
    assert RunConfig(report_to="wandb, tensorboard").report_to == "wandb,tensorboard"
    assert RunConfig().report_to is None  # none by default
    assert tracker_names("wandb,tensorboard") == ["wandb", "tensorboard"]


def test_an_unknown_tracker_is_one_sentence_listing_the_known_ones():
    with pytest.raises(ConfigError) as err:
        RunConfig(report_to="tensorboard,neptune")
    message = str(err.value)
    assert "neptune" in message and "tensorboard, mlflow, wandb" in message and "\n" not in message


def test_tracker_options_are_names_and_tags_of_named_trackers_only():
    options = json.dumps({"wandb": {"project": "p", "name": "n", "entity": "e", "tags": ["a", "b"]}})
    assert RunConfig(report_to="wandb", tracker_options=options).tracker_options == options
    bad = {
        "not json": "must be a JSON object",
        json.dumps({"mlflow": {"experiment": "x"}}): "which --report-to does not name",
        json.dumps({"wandb": {"api_key": "secret"}}): "wandb has no option 'api_key'",
        json.dumps({"wandb": {"tags": "one"}}): "must be a list of texts",
        json.dumps({"wandb": {"project": 3}}): "must be text",
        json.dumps(["wandb"]): "must be a JSON object",
    }
    for value, expected in bad.items():
        with pytest.raises(ConfigError, match=expected):
            RunConfig(report_to="wandb", tracker_options=value)


def test_a_missing_library_says_which_extra_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        check_installed("tensorboard,mlflow")
    assert str(err.value) == "--report-to mlflow needs the mlflow package: pip install 'finetune[mlflow]'"


def test_train_refuses_a_missing_tracker_before_writing_anything(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    out = tmp_path / "run"
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    assert main(["train", str(data), "--model", str(tmp_path), "--out", str(out), "--report-to", "wandb"]) == 1
    assert "pip install 'finetune[wandb]'" in capsys.readouterr().err
    assert not out.exists()


def test_report_to_is_a_train_setting_from_flags_and_yaml(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("report_to: tensorboard\ntracker_options: '{\"tensorboard\": {}}'\n")
    loaded = RunConfig.from_yaml(config)
    assert loaded.report_to == "tensorboard" and json.loads(loaded.tracker_options) == {"tensorboard": {}}
    from finetune.settings.registry import command_settings

    assert "report_to" in {s.name for s in command_settings("train")}
    assert "report_to" not in {s.name for s in command_settings("plan")}
