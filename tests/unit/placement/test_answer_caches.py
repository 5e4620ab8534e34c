"""The caches of generated answers know what generated them: a base's identity covers its weights' bytes (each file's
sha256 remembered by path, size and modification time, so it is read once), and the keys of replay's answers and of
the retention check's base side cover the device, the precision and the torch/transformers versions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from finetune.data.tokenize import load_tokenizer
from finetune.placement.where import Placement
from finetune.settings import fingerprint
from finetune.settings.config import RunConfig
from finetune.settings.fingerprint import model_identity
from finetune.ship.eval import replay


def _flip_a_weight(folder: Path) -> None:
    """Change one byte of the tensor data, past the header: the names, shapes and dtypes stay as they were."""
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header = int.from_bytes(data[:8], "little")
    data[8 + header + 5] ^= 0x01
    weights.write_bytes(bytes(data))


def test_a_base_whose_weights_changed_is_another_base(toy_model, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    copy = Path(shutil.copytree(toy_model, tmp_path / "base"))
    before = model_identity(str(copy))
    _flip_a_weight(copy)
    assert model_identity(str(copy)) != before


def test_the_weights_digest_is_read_once_then_remembered(toy_model, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    read = []
    real = fingerprint.file_sha256
    monkeypatch.setattr(fingerprint, "file_sha256", lambda path: read.append(path) or real(path))
    first = model_identity(str(toy_model))
    assert model_identity(str(toy_model)) == first and len(read) == 1


def test_replays_answers_are_keyed_by_where_and_how_they_were_generated(toy_model, monkeypatch):
    tokenizer = load_tokenizer(str(toy_model))
    keys = {dtype: replay.cache_key(RunConfig(model=str(toy_model), gpu="cpu", dtype=dtype), tokenizer)
            for dtype in ("fp32", "bf16")}  # fmt: skip
    assert keys["fp32"] != keys["bf16"]
    key = Placement("cpu", "fp32").cache_key()
    assert {"device", "dtype", "torch", "transformers"} <= set(key) and key["torch"] and key["transformers"]
    monkeypatch.setattr(replay, "of_config", lambda config: Placement("cuda", "fp32"))
    assert replay.cache_key(RunConfig(model=str(toy_model), gpu="cpu", dtype="fp32"), tokenizer) != keys["fp32"]
    assert json.dumps(key)  # plain JSON: part of a hashed identity
