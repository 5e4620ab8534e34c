"""Every failure a message, never a traceback: --out that cannot be used, flag conflicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from reliability_helpers import TRAIN, assert_clean_failure, cli


def _train(out, *extra: str, model: str = "no-such-model-anywhere"):
    # the model does not exist: a message about --out proves --out is checked before the tokenizer loads
    return cli("train", str(TRAIN), "--model", model, "--out", str(out), *extra)


def test_out_that_is_a_file(tmp_path):
    out = tmp_path / "taken.txt"
    out.write_text("mine")
    assert_clean_failure(_train(out), f"--out {out} is a file, not a folder")
    assert out.read_text() == "mine"


def test_out_below_a_file(tmp_path):
    (tmp_path / "file").write_text("mine")
    assert_clean_failure(_train(tmp_path / "file" / "run"), "cannot write there (Not a directory)")


def test_out_on_a_read_only_disk(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root (as root, permissions alone never refuse a write)")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        assert_clean_failure(_train(mount / "run"), "cannot write there (Read-only file system)")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_val_file_with_val_fraction_is_a_flag_conflict(tmp_path):
    result = _train(tmp_path / "run", "--val-file", str(TRAIN), "--val-fraction", "0.1")
    assert_clean_failure(result, "--val-file and --val-fraction cannot be used together")


def test_model_path_that_does_not_exist_says_no_such_folder(tmp_path):
    missing = tmp_path / "models" / "mine"
    result = cli("train", str(TRAIN), "--model", str(missing), "--out", str(tmp_path / "run"))
    assert_clean_failure(result, f"--model {missing}: no such folder")
    assert "Repo id" not in result.stderr


def test_model_that_is_a_file(tmp_path):
    result = cli("train", str(TRAIN), "--model", str(TRAIN), "--out", str(tmp_path / "run"))
    assert_clean_failure(result, "is a file; pass the folder that holds the model")


def test_hub_id_without_network_fails_at_once_and_says_how_to_use_a_folder(tmp_path):
    # a hub that refuses connections: what a machine without network sees, without depending on the network
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "finetune", "train", str(TRAIN), "--model", "some-org/some-model", "--out",
               str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert_clean_failure(result, "cannot reach the Hugging Face hub", "Pass a local model folder as --model")


def test_val_file_that_loses_every_conversation_warns_validation_is_off(tmp_path):
    result = cli("plan", str(TRAIN), "--val-file", str(TRAIN), "--json")
    assert result.returncode == 0, result.stderr
    (warning,) = [w for w in json.loads(result.stdout)["warnings"] if w["code"] == "val_file_emptied"]
    assert warning["message"].startswith("validation is off: its ")


def test_a_run_that_fails_at_the_start_leaves_no_out_folder_behind(tmp_path):
    """--out is probed by creating it; a run refused afterwards (here: no such model) removes what the probe made."""
    out = tmp_path / "new" / "deeper" / "run"
    assert_clean_failure(_train(out, model=str(tmp_path / "no-model")), "no such folder")
    assert not (tmp_path / "new").exists()


def test_a_model_with_custom_code_names_the_flag_not_the_python_argument(tmp_path, toy_model):
    """transformers asks for `trust_remote_code=True` (a Python argument) in three lines; the command line's
    way to say it is --trust-remote-code, in one."""
    import shutil

    custom = tmp_path / "custom-model"
    shutil.copytree(toy_model, custom)
    config = json.loads((custom / "config.json").read_text())
    config |= {"model_type": "toy_custom", "auto_map": {"AutoConfig": "configuration_toy.ToyConfig",
                                                  "AutoModelForCausalLM": "modeling_toy.ToyModel"}}  # fmt: skip
    (custom / "config.json").write_text(json.dumps(config))
    result = cli("train", str(TRAIN), "--model", str(custom), "--out", str(tmp_path / "run"), "--max-steps", "1")
    assert_clean_failure(result, "--trust-remote-code")
    message = result.stderr.split("error: ", 1)[1]
    assert "trust_remote_code=True" not in message and "\n" not in message.strip(), message
