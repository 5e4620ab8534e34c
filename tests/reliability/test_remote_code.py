"""A model folder whose config.json asks for its own Python code (`auto_map`): every command says the same thing,
once (issue 35). Before: `validate` and `plan` said OK for a model `train` then refused, and with a known
model_type training went ahead on the built-in class without a word."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from reliability_helpers import TRAIN, assert_clean_failure, cli

AUTO_MAP = {"AutoConfig": "configuration_toy.ToyConfig", "AutoModelForCausalLM": "modeling_toy.ToyModel"}
FAST = ["--max-steps", "1", "--batch-size", "4", "--max-seq-len", "256", "--val-fraction", "0"]


def _with_auto_map(tmp_path, toy_model, **changes):
    folder = tmp_path / "custom-model"
    shutil.copytree(toy_model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": AUTO_MAP, **changes}))
    return folder


def _commands(model, out) -> dict[str, list[str]]:
    return {
        "validate": ["validate", str(TRAIN), "--model", str(model)],
        "plan": ["plan", str(TRAIN), "--model", str(model)],
        "train": ["train", str(TRAIN), "--model", str(model), "--out", str(out), *FAST],
    }


def test_an_unknown_model_type_is_refused_alike_by_validate_plan_and_train(tmp_path, toy_model):
    folder = _with_auto_map(tmp_path, toy_model, model_type="toy_custom")
    errors = {}
    for name, args in _commands(folder, tmp_path / "run").items():
        result = cli(*args)
        assert_clean_failure(result, "needs Python code from the model's own folder", "--trust-remote-code")
        errors[name] = result.stderr.strip()
    assert len(set(errors.values())) == 1, errors
    assert errors["train"] == f"error: cannot load the model '{folder}': it needs Python code from the model's own " \
        "folder or repository, which finetune runs only with --trust-remote-code (read that code first: it runs " \
        "with your rights)"  # fmt: skip


def _expected(folder) -> str:
    return (
        f"warning: the config.json of {folder} asks for its own Python code (auto_map), which is ignored without "
        "--trust-remote-code: transformers' built-in llama class is used"
    )


def test_a_known_model_type_says_once_in_each_command_that_the_custom_code_is_ignored(
    tmp_path, toy_model, monkeypatch, caplog
):
    """train loads the tokenizer and the model, and says it once too."""
    from finetune.models import source as model_source

    folder = _with_auto_map(tmp_path, toy_model)  # the toy's own model_type: llama
    said = {}
    for name, args in _commands(folder, tmp_path / "run").items():
        monkeypatch.setattr(model_source, "_SAID", set())  # once per process: each command here is a process
        caplog.clear()
        with caplog.at_level("INFO", logger="finetune"):
            result = cli(*args)
        assert result.returncode == 0, (name, result.stderr)
        said[name] = [r.getMessage() for r in caplog.records if "auto_map" in r.getMessage()]
    assert said == {name: [_expected(folder)] for name in said}, said


def test_the_command_line_prints_the_warning_on_stderr(tmp_path, toy_model):
    folder = _with_auto_map(tmp_path, toy_model)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "finetune", *_commands(folder, tmp_path / "run")["validate"]]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if "auto_map" in line] == [_expected(folder)]


def test_the_loaders_of_eval_export_and_serving_say_the_same(tmp_path, toy_model, monkeypatch, caplog):
    """eval, export and the serving engine load through load_tokenizer and load_model: each reads config.json
    first, so each refuses or warns exactly as train does."""
    import pytest

    from finetune.data.tokenize import load_tokenizer
    from finetune.models import source as model_source
    from finetune.settings.errors import UserError
    from finetune.train.model import load_model

    custom = _with_auto_map(tmp_path / "a", toy_model, model_type="toy_custom")
    known = _with_auto_map(tmp_path / "b", toy_model)
    for load in (load_tokenizer, load_model):
        with pytest.raises(UserError) as refused:
            load(str(custom))
        assert str(refused.value) == f"cannot load the model '{custom}': it needs Python code from the model's own " \
            "folder or repository, which finetune runs only with --trust-remote-code (read that code first: it " \
            "runs with your rights)"  # fmt: skip
        monkeypatch.setattr(model_source, "_SAID", set())
        caplog.clear()
        with caplog.at_level("INFO", logger="finetune"):
            load(str(known))
        assert [r.getMessage() for r in caplog.records if "auto_map" in r.getMessage()] == [_expected(known)]
