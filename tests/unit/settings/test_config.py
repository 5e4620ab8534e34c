"""RunConfig is the one declaration of a setting: flags, YAML keys and checks all come from it."""

import argparse

import pytest

from finetune.commands.cli import build_parser
from finetune.settings.config import ConfigError, RunConfig
from finetune.settings.registry import command_settings, settings


def _flags(command: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {option for action in sub._actions for option in action.option_strings}


def test_every_setting_is_a_train_flag_with_its_docstring_as_help():
    flags = _flags("train")
    for spec in settings():
        if spec.name == "data":
            continue  # the positional argument
        name = spec.flag if not (spec.kind is bool and spec.default is True) else "--no-" + spec.flag[2:]
        assert name in flags, spec.name
        assert spec.help, f"{spec.name} has no docstring"


def test_validate_takes_the_data_settings_of_train():
    assert {"--max-seq-len", "--record-policy", "--truncation", "--val-file", "--val-fraction", "--model"} <= (
        _flags("validate")
    )
    assert {s.name for s in command_settings("validate")} < {s.name for s in command_settings("train")}


def test_choices_come_from_the_literal_types():
    with pytest.raises(ConfigError, match="--schedule must be one of linear, cosine"):
        RunConfig(schedule="step")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "x.jsonl", "--schedule", "step"])


def test_text_values_from_yaml_are_parsed_by_the_declared_type(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 2e-4\nepochs: '3'\ngradient-checkpointing: on\nmax_grad_norm: none\n")
    config = RunConfig.from_yaml(path)
    assert (config.lr, config.epochs, config.gradient_checkpointing, config.max_grad_norm) == (2e-4, 3, True, None)
    with pytest.raises(ConfigError, match="unknown setting"):
        RunConfig.from_dict({"learning_rate": 1e-4})


def test_flags_override_the_yaml_file_and_defaults_stay_with_runconfig(tmp_path):
    from finetune.commands.cli import _config_from_args

    path = tmp_path / "run.yaml"
    path.write_text("epochs: 5\nmodel: m\nout: o\n")
    args = build_parser().parse_args(["train", "d.jsonl", "--config", str(path), "--epochs", "2", "--no-packing"])
    config = _config_from_args(args, data=args.data, command="train")
    assert (config.epochs, config.packing, config.model, config.grad_accum) == (2, False, "m", 1)


def test_required_settings_are_checked_in_one_place():
    with pytest.raises(ConfigError, match="no output folder"):
        RunConfig(data="d.jsonl", model="m").check_required("train")
    RunConfig(data="d.jsonl").check_required("plan")  # plan runs without a model
