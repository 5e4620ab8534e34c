"""--resume trusts only checkpoints that match their manifest: each damage is named in one line and the
run falls back to the newest good checkpoint; with none good it says what it found and starts at step 0."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from reliability_helpers import save_steps

from finetune.train.checkpoint import (
    MANIFEST,
    find_resume_point,
    list_checkpoints,
    load_checkpoint,
    remove_stale_tmp,
    set_aside_damaged,
    verify_checkpoint,
)


def _truncate(folder: Path) -> None:
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _flip_bit(folder: Path) -> None:
    weights = folder / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01  # inside the last tensor's numbers: the file still loads, the weights are wrong
    weights.write_bytes(bytes(data))


def _remove(name: str):
    return lambda folder: (folder / name).unlink()


def _empty(folder: Path) -> None:
    for path in folder.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _garble_manifest(folder: Path) -> None:
    (folder / MANIFEST).write_text("{not json")


DAMAGES = {
    "truncated weights": (_truncate, "adapter_model.safetensors has"),
    "flipped bit in the weights": (_flip_bit, "does not match its checksum"),
    "missing optimizer": (_remove("training_state/optimizer.safetensors"), "optimizer.safetensors is missing"),
    "missing rng": (_remove("training_state/rng.json"), "training_state/rng.json is missing"),
    "missing state": (_remove("state.json"), "state.json is missing"),
    "missing manifest (save never finished)": (_remove(MANIFEST), "save never finished"),
    "damaged manifest": (_garble_manifest, "manifest.json is damaged"),
    "empty step folder": (_empty, "the folder is empty"),
}


def test_a_saved_checkpoint_verifies_and_loads(lora, tmp_path):
    (folder,) = save_steps(tmp_path, lora, [3])
    assert verify_checkpoint(folder) is None
    manifest = json.loads((folder / MANIFEST).read_text())["files"]
    state = {"training_state/optimizer.safetensors", "training_state/optimizer.json", "training_state/rng.safetensors"}
    assert {"adapter_model.safetensors", "state.json", *state} <= set(manifest)
    model, optimizer = lora
    assert load_checkpoint(folder, model, optimizer, is_lora=True).step == 3


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_damaged_newest_checkpoint_falls_back_to_the_newest_good_one(lora, tmp_path, damage):
    damage_fn, reason = DAMAGES[damage]
    good, newest = save_steps(tmp_path, lora, [2, 4])
    damage_fn(newest)

    point = find_resume_point(tmp_path)
    assert point.folder == good
    assert [p for p, _ in point.damaged] == [newest]
    message = point.message(tmp_path)
    assert "\n" not in message and reason in message and "resuming from step-000002" in message, message

    set_aside_damaged(point)  # what the loop does: the damaged one is kept for a look, never resumed again
    assert list_checkpoints(tmp_path) == [good]
    assert (tmp_path / "checkpoints" / "step-000004.damaged").is_dir()


def test_no_good_checkpoint_says_what_it_found_and_starts_at_step_0(lora, tmp_path):
    first, second = save_steps(tmp_path, lora, [1, 2])
    _flip_bit(first)
    _remove("training_state/optimizer.json")(second)
    point = find_resume_point(tmp_path)
    assert point.folder is None
    message = point.message(tmp_path)
    assert "step-000002 is damaged: training_state/optimizer.json is missing" in message
    assert "step-000001 is damaged" in message and "starting from step 0" in message


def test_resume_with_no_checkpoint_at_all_starts_at_step_0(tmp_path):
    point = find_resume_point(tmp_path)
    assert point.folder is None and point.damaged == []
    assert "holds no checkpoint yet; starting from step 0" in point.message(tmp_path)


def test_stale_tmp_folders_are_removed(lora, tmp_path):
    (good,) = save_steps(tmp_path, lora, [1])
    stale = tmp_path / "checkpoints" / "step-000002.tmp"
    stale.mkdir()
    (stale / "adapter_model.safetensors").write_bytes(b"half")
    (tmp_path / "adapter.tmp").mkdir()
    removed = remove_stale_tmp(tmp_path)
    assert sorted(p.name for p in removed) == ["adapter.tmp", "step-000002.tmp"]
    assert not stale.exists() and list_checkpoints(tmp_path) == [good]


def test_manifest_is_written_last(lora, tmp_path, monkeypatch):
    """A crash anywhere before the manifest leaves a folder that verification refuses."""
    from finetune.train import checkpoint

    seen = {}

    def spy(folder: Path) -> None:
        seen["before"] = sorted(os.listdir(folder))
        raise KeyboardInterrupt  # the process dies here

    monkeypatch.setattr(checkpoint, "_write_manifest", spy)
    with pytest.raises(KeyboardInterrupt):
        save_steps(tmp_path, lora, [1])
    assert MANIFEST not in seen["before"] and "training_state" in seen["before"]
    assert list_checkpoints(tmp_path) == []  # only a .tmp, which the next start removes
