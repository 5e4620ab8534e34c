"""Malformed safetensors in a model folder are a clear error from `plan` (and so from `train`, which plans
first), never a traceback, and never "fine" for a file the loader would refuse."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from reliability_helpers import assert_clean_failure, cli

from finetune.models.facts import load_model_facts
from finetune.settings.errors import UserError


def _file(header: object, data: bytes = b"", length: int | None = None) -> bytes:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(text) if length is None else length) + text + data


F32_2X2 = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
CASES = {
    "huge header length": (_file(F32_2X2, bytes(16), length=2**62), "header length"),
    "header that is a list": (_file([1, 2, 3]), "its header is an array, not an object"),
    "non-numeric shape": (_file({"w": {"dtype": "F32", "shape": ["2", 2], "data_offsets": [0, 16]}}, bytes(16)),
                          "a shape is a list of whole numbers"),
    "bad metadata": (_file({"__metadata__": {"format": 3}, **F32_2X2}, bytes(16)), "__metadata__"),
    "truncated data": (_file(F32_2X2, bytes(10)), "6 bytes are missing (truncated)"),
    "offsets that do not fit the dtype": (_file({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}},
                                                bytes(16)), "does not fit its 16 bytes"),
    "entry that is not an object": (_file({"w": "F32"}), "is a string, not an object"),
    "header that is not JSON": (_file(b"{not json"), "not readable JSON"),
}  # fmt: skip


def _model_folder(toy_model: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(toy_model / "config.json", folder / "config.json")
    return folder


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_malformed_weight_file_is_a_clear_error(toy_model, tmp_path, case):
    content, words = CASES[case]
    folder = _model_folder(toy_model, tmp_path)
    (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(UserError) as caught:
        load_model_facts(str(folder))
    assert str(caught.value).startswith(f"{folder / 'model.safetensors'}: not a usable safetensors file: ")
    assert words in str(caught.value)

    from safetensors.torch import load_file  # the loader `train` uses refuses it too: plan is not stricter

    with pytest.raises(Exception):  # noqa: B017 - safetensors raises its own error types
        load_file(folder / "model.safetensors")


def test_the_good_toy_model_passes(toy_model):
    assert load_model_facts(str(toy_model)).exact


@pytest.mark.parametrize(
    ("index", "words"),
    [
        ("{broken", "the index of the weight files is not readable JSON"),
        (json.dumps({"weight_map": []}), "the index has no weight_map object"),
        (json.dumps({"weight_map": {"w": "missing-00001.safetensors"}}), "names the weight file missing-00001"),
        (json.dumps({"weight_map": {"w": "../../etc/passwd"}}), "is '../../etc/passwd', not a file name"),
    ],
    ids=["not JSON", "weight_map an array", "missing shard", "path outside the folder"],
)
def test_broken_index_json_is_a_clear_error(toy_model, tmp_path, index, words):
    folder = _model_folder(toy_model, tmp_path)
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(UserError, match="model.safetensors.index.json: ") as caught:
        load_model_facts(str(folder))
    assert words in str(caught.value)


def test_plan_command_reports_it_in_one_line(toy_model, tmp_path):
    folder = _model_folder(toy_model, tmp_path)
    (folder / "model.safetensors").write_bytes(CASES["header that is a list"][0])
    result = cli("plan", "--examples", "100", "--model", str(folder))
    assert_clean_failure(result, "its header is an array, not an object")
