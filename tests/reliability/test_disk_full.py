"""A disk that fills during a save: the partial step-N.tmp is removed, the last good checkpoint survives,
the message names both steps, and once there is room again the same save works."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from reliability_helpers import save_steps, train_in_process

from finetune.train.checkpoint import DiskFull, find_resume_point, list_checkpoints, verify_checkpoint


def _half_then_enospc(obj, f, *args, **kwargs):
    """A writer on a disk that fills halfway through the file."""
    Path(f).write_bytes(b"\0" * 512)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))


def test_fault_injected_enospc_keeps_the_last_good_checkpoint(lora, tmp_path, monkeypatch):
    from finetune.train import state_files

    (good,) = save_steps(tmp_path, lora, [1])
    monkeypatch.setattr(state_files, "save_file", _half_then_enospc)  # the optimizer state's writer
    with pytest.raises(DiskFull) as caught:
        save_steps(tmp_path, lora, [2])
    assert str(caught.value).startswith(
        f"disk full while saving step 2 to {tmp_path / 'checkpoints'}; the last good checkpoint is step 1"
    )
    assert not (tmp_path / "checkpoints" / "step-000002.tmp").exists()
    assert list_checkpoints(tmp_path) == [good] and verify_checkpoint(good) is None

    monkeypatch.undo()  # space freed: the same save now works
    save_steps(tmp_path, lora, [2])
    assert find_resume_point(tmp_path).folder.name == "step-000002"


@pytest.fixture
def small_disk(tmp_path):
    """A real tmpfs mount (needs root); skipped where mounting is not allowed."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _resize(mount: Path, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount)], check=True)


def test_real_full_disk_during_a_save(lora, tmp_path, small_disk):
    """A writer may not name a full disk as such (torch.save said "unexpected pos"): the check asks the disk itself."""
    (probe,) = save_steps(tmp_path / "probe", lora, [1])
    one = sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())
    page = 4096
    _resize(small_disk, (one * 3 // 2 // page + 4) * page)  # room for one checkpoint, not for two
    (good,) = save_steps(small_disk, lora, [1])
    with pytest.raises(DiskFull, match="disk full while saving step 2 to .*; the last good checkpoint is step 1"):
        save_steps(small_disk, lora, [2])
    assert sorted(p.name for p in (small_disk / "checkpoints").iterdir()) == ["step-000001"]
    assert verify_checkpoint(good) is None

    _resize(small_disk, (one * 3 // page + 8) * page)
    save_steps(small_disk, lora, [2])
    assert [p.name for p in list_checkpoints(small_disk)] == ["step-000001", "step-000002"]


def test_run_stops_on_full_disk_and_resumes_once_space_is_freed(toy_model, tmp_path, monkeypatch):
    from finetune.train import checkpoint

    real = checkpoint._write_checkpoint_files

    def full_at_step_2(tmp, model, optimizer, state, *rest):
        if state.step == 2:
            (tmp / "adapter_model.safetensors").write_bytes(bytes(1000))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tmp, model, optimizer, state, *rest)

    out = tmp_path / "run"
    monkeypatch.setattr(checkpoint, "_write_checkpoint_files", full_at_step_2)
    with pytest.raises(DiskFull) as caught:
        train_in_process(toy_model, out)
    assert str(caught.value).startswith(
        f"disk full while saving step 2 to {out / 'checkpoints'}; the last good checkpoint is step 1"
    )
    assert [p.name for p in list_checkpoints(out)] == ["step-000001"]
    assert not list((out / "checkpoints").glob("*.tmp"))

    monkeypatch.undo()
    report = train_in_process(toy_model, out, resume=True)
    assert report["steps_taken"] == 3 and (out / "adapter" / "adapter_model.safetensors").is_file()


def test_full_disk_while_logging_metrics_is_one_line_too(toy_model, tmp_path, monkeypatch):
    from finetune.report.metrics import MetricsLog
    from finetune.settings.errors import UserError

    real = MetricsLog.append

    def append(self, row):
        if row["step"] == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        real(self, row)

    monkeypatch.setattr(MetricsLog, "append", append)
    out = tmp_path / "run"
    with pytest.raises(UserError) as caught:
        train_in_process(toy_model, out)
    assert str(caught.value).startswith(
        f"disk full while writing {out / 'metrics.jsonl'}; the last good checkpoint is step 1"
    )
