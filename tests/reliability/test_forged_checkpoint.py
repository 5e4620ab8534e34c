"""A checkpoint whose state files were forged (a pickle payload, with a manifest that matches it) is damaged like
any other: named in one line, set aside, the run resumes from the checkpoint before it. Nothing in it runs, and
the unpickler's advice to turn `weights_only` off is never shown. New checkpoints hold no pickle at all."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from reliability_helpers import save_steps, train_command, train_in_process

from finetune.train.checkpoint import MANIFEST, find_resume_point, load_checkpoint, verify_checkpoint


class _Payload:
    """Unpickled, it would create the marker file: proof that code in the checkpoint ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _rewrite_manifest(folder: Path) -> None:
    """What a forger does: a manifest that matches the forged files."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {
        p.relative_to(folder).as_posix(): {
            "bytes": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in files
    }
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": entries}))


def _as_earlier_version(folder: Path, optimizer) -> None:
    """The checkpoint as finetune wrote it before: optimizer.pt and rng.pt (torch.save), no training_state/."""
    from finetune.train.checkpoint import _rng_state

    shutil.rmtree(folder / "training_state", ignore_errors=True)
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(_rng_state(), folder / "rng.pt")
    _rewrite_manifest(folder)


@pytest.mark.parametrize("forged", ["rng.pt", "optimizer.pt"])
def test_a_pickle_payload_in_a_state_file_is_damage_and_never_runs(lora, tmp_path, forged):
    good, newest = save_steps(tmp_path, lora, [2, 4])
    _as_earlier_version(newest, lora[1])
    marker = tmp_path / "payload-ran"
    (newest / forged).write_bytes(pickle.dumps(_Payload(marker)))
    _rewrite_manifest(newest)

    point = find_resume_point(tmp_path)
    assert point.folder == good and [p for p, _ in point.damaged] == [newest]
    message = point.message(tmp_path)
    assert "\n" not in message and forged in message and "resuming from step-000002" in message, message
    assert "weights_only" not in message and not marker.exists()


def test_new_checkpoints_hold_no_pickle_and_a_planted_one_is_never_read(lora, tmp_path):
    (folder,) = save_steps(tmp_path, lora, [3])
    for path in folder.rglob("*"):
        if path.is_file():
            head = path.read_bytes()[:2]
            assert head not in (b"PK", b"\x80\x02", b"\x80\x04", b"\x80\x05"), f"{path.name} is a pickle"
    assert not (folder / "optimizer.pt").exists() and not (folder / "rng.pt").exists()
    marker = tmp_path / "payload-ran"
    (folder / "optimizer.pt").write_bytes(pickle.dumps(_Payload(marker)))  # beside the real state, listed too
    _rewrite_manifest(folder)
    assert verify_checkpoint(folder) is None
    model, optimizer = lora
    assert load_checkpoint(folder, model, optimizer, is_lora=True).step == 3
    assert not marker.exists()


def _state_tensors(optimizer) -> list[torch.Tensor]:
    state = optimizer.state_dict()["state"]
    return [t for key in sorted(state) for _, t in sorted(state[key].items())]


@pytest.mark.parametrize("earlier_version", [False, True], ids=["safetensors+json", "earlier optimizer.pt"])
def test_optimizer_and_rng_state_come_back_bit_for_bit(lora, tmp_path, earlier_version):
    model, optimizer = lora
    before = [t.clone() for t in _state_tensors(optimizer)]
    groups = optimizer.state_dict()["param_groups"]
    rng = torch.get_rng_state()
    (folder,) = save_steps(tmp_path, lora, [5])
    if earlier_version:
        _as_earlier_version(folder, optimizer)
    assert verify_checkpoint(folder) is None
    torch.manual_seed(1234)  # move the generator on: loading must put it back
    for t in _state_tensors(optimizer):
        t.zero_()
    load_checkpoint(folder, model, optimizer, is_lora=True)
    after = _state_tensors(optimizer)
    assert len(after) == len(before) and all(
        torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(after, before, strict=True)
    )
    assert optimizer.state_dict()["param_groups"] == groups
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda f: (f / "training_state" / "optimizer.json").write_text("{not json"), "optimizer.json is not readable"),
        (lambda f: (f / "training_state" / "rng.safetensors").write_bytes(b"\x80\x04junk"), "rng.safetensors is not"),
        (
            lambda f: (f / "training_state" / "rng.json").write_text('{"format": 1, "state": {"tensor": "t99"}}'),
            "rng.json does not describe",
        ),  # fmt: skip
    ],
    ids=["optimizer.json not JSON", "rng.safetensors not safetensors", "rng.json names a tensor that is not there"],
)
def test_state_files_that_do_not_read_back_are_damage_even_with_a_matching_manifest(lora, tmp_path, damage, reason):
    good, newest = save_steps(tmp_path, lora, [2, 4])
    damage(newest)
    _rewrite_manifest(newest)
    point = find_resume_point(tmp_path)
    assert point.folder == good and reason in point.message(tmp_path), point.message(tmp_path)


def test_resume_over_a_forged_checkpoint_falls_back_in_one_line(toy_model, tmp_path):
    out = tmp_path / "run"
    train_in_process(toy_model, out)
    (out / "report.json").unlink()  # as if the run died after its last checkpoint
    newest = out / "checkpoints" / "step-000003"
    marker = tmp_path / "payload-ran"
    # an earlier version's checkpoint whose rng.pt is a pickle payload, with a manifest to match
    shutil.rmtree(newest / "training_state", ignore_errors=True)
    if not (newest / "optimizer.pt").exists():
        torch.save({"state": {}, "param_groups": []}, newest / "optimizer.pt")
    (newest / "rng.pt").write_bytes(pickle.dumps(_Payload(marker)))
    _rewrite_manifest(newest)

    done = subprocess.run(train_command(toy_model, out, "--resume"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "weights_only" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "step-000003 is damaged" in line]
    assert len(lines) == 1 and "rng.pt" in lines[0] and "resuming from step-000002" in lines[0], done.stderr
    assert not marker.exists()
    assert (out / "checkpoints" / "step-000003.damaged").is_dir() and (out / "report.json").is_file()
