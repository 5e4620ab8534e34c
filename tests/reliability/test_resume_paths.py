"""The moments a run can die or be restarted: killed during its first save, resumed when damaged, resumed
when already finished, resumed with changed settings. Each ends in a run that continues, or in one line."""

from __future__ import annotations

import errno
import json
import math
import shutil
import signal

import pytest
from reliability_helpers import assert_clean_failure, cli, run_cli, train_command, train_in_process, weights_finite

from finetune.settings.errors import UserError
from finetune.train.checkpoint import DiskFull, list_checkpoints
from finetune.train.loop import TrainingDiverged
from finetune.train.objective import TokenNormalisedSFT

KILL_AT_FIRST_SAVE = """
import os, signal
from finetune.train import checkpoint as c
def die(folder):  # the weights and optimizer are written, the manifest is not: a crash in the middle of the save
    os.kill(os.getpid(), signal.SIGKILL)
c._write_manifest = die
"""


@pytest.fixture(scope="module")
def finished(toy_model, tmp_path_factory):
    """One finished 3-step run, copied by the tests that damage or resume it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train_in_process(toy_model, out)
    return out


def test_killed_during_the_first_save_then_resume_starts_from_step_0(toy_model, tmp_path):
    out = tmp_path / "run"
    killed = run_cli(*train_command(toy_model, out)[3:], bootstrap=KILL_AT_FIRST_SAVE)
    assert killed.returncode == -signal.SIGKILL
    assert list_checkpoints(out) == [] and list((out / "checkpoints").glob("*.tmp"))

    plain = cli(*train_command(toy_model, out)[3:])  # a plain rerun points at --resume
    assert_clean_failure(plain, "pass --resume to continue it")

    lines: list[str] = []
    train_in_process(toy_model, out, resume=True, show=lines.append)
    assert any("holds no checkpoint yet; starting from step 0" in line for line in lines)
    assert not list((out / "checkpoints").glob("*.tmp"))  # the stale half-save is gone
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]


def test_flipped_bit_in_the_newest_checkpoint_resumes_from_the_one_before(toy_model, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "report.json").unlink()  # not finished any more: the last step must be redone
    newest = list_checkpoints(out)[-1]
    weights = newest / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01
    weights.write_bytes(bytes(data))
    lines: list[str] = []
    report = train_in_process(toy_model, out, resume=True, show=lines.append)
    (message,) = [line for line in lines if line.startswith("--resume:")]
    assert message == (
        "--resume: step-000003 is damaged: adapter_model.safetensors does not match its checksum (damaged on disk); "
        "resuming from step-000002"
    )
    assert report["steps_taken"] == 3 and (out / "checkpoints" / "step-000003.damaged").is_dir()


def test_resuming_a_finished_run_changes_nothing(toy_model, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    lines: list[str] = []
    report = train_in_process(toy_model, out, resume=True, show=lines.append)
    assert any("holds a finished run (3 of 3 steps" in line and "nothing was changed" in line for line in lines)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and report == json.loads((out / "report.json").read_text())


def test_time_adds_up_across_resumes(toy_model, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    first = json.loads((finished / "report.json").read_text())["wall_time_s"]
    (out / "report.json").unlink()
    shutil.rmtree(out / "checkpoints" / "step-000003")  # as if stopped after step 2
    from finetune.train.checkpoint import read_state

    before = read_state(list_checkpoints(out)[-1]).elapsed_s
    assert 0 < before <= first
    report = train_in_process(toy_model, out, resume=True)
    assert report["wall_time_s"] > before  # the resumed session's time is added, not restarted at 0


def test_resume_with_another_lr_is_refused_then_allowed_and_recorded(toy_model, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "report.json").unlink()
    shutil.rmtree(out / "checkpoints" / "step-000003")
    auto_lr = json.loads((out / "plan.json").read_text())["learning_rate"]
    assert auto_lr != 1e-3
    with pytest.raises(UserError, match=rf"the learning rate changed \({auto_lr:g} then, 0.001 now\)"):
        train_in_process(toy_model, out, resume=True, lr=1e-3)
    report = train_in_process(toy_model, out, resume=True, lr=1e-3, allow_changes="lr")
    assert report["resumed_with_changes"] == [{"setting": "lr", "before": auto_lr, "now": 1e-3, "at_step": 2}]


def test_resume_with_another_lora_rank_is_one_line_not_a_size_mismatch(toy_model, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "report.json").unlink()
    result = cli(*train_command(toy_model, out, "--resume", "--lora-rank", "16")[3:])
    assert_clean_failure(result, "the LoRA rank changed", "which a checkpoint cannot carry over")
    assert "size mismatch" not in result.stderr


def test_resume_with_other_data_of_the_same_length_is_refused(toy_model, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "report.json").unlink()
    from reliability_helpers import TRAIN

    other = tmp_path / "other.jsonl"
    other.write_text(TRAIN.read_text().replace("the", "teh"))
    assert other.read_text().count("\n") == TRAIN.read_text().count("\n")
    with pytest.raises(UserError, match="the training data changed"):
        train_in_process(toy_model, out, data=other, resume=True)


def test_checkpoints_of_a_run_are_finite(finished):
    assert all(weights_finite(folder) for folder in list_checkpoints(finished))


class _NanAtFirstStep(TokenNormalisedSFT):
    """A loss that is NaN on the first training micro-batch: the run dies before its first checkpoint."""

    def loss(self, model, batch):
        loss_sum, metrics = super().loss(model, batch)
        return (loss_sum * math.nan if model.training else loss_sum), metrics


def _rerun_then_resume_from_step_0(toy_model, out) -> None:
    """What a crash before the first checkpoint must leave: a folder a plain rerun points at --resume for, and
    that --resume accepts, starting from step 0 and saying so."""
    assert list_checkpoints(out) == []
    plain = cli(*train_command(toy_model, out)[3:])
    assert_clean_failure(plain, "pass --resume to continue it")
    lines: list[str] = []
    report = train_in_process(toy_model, out, resume=True, show=lines.append)
    assert any("holds no checkpoint yet; starting from step 0" in line for line in lines), lines
    assert report["steps_taken"] == 3
    assert [json.loads(row)["step"] for row in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_nan_at_step_1_then_resume_starts_from_step_0(toy_model, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(TrainingDiverged, match="at step 1; the step was not saved and no checkpoint was saved yet"):
        train_in_process(toy_model, out, objective=_NanAtFirstStep())
    _rerun_then_resume_from_step_0(toy_model, out)


def test_full_disk_at_the_first_save_then_resume_starts_from_step_0(toy_model, tmp_path, monkeypatch):
    from finetune.train import checkpoint

    def full(tmp, *args):
        (tmp / "adapter_model.safetensors").write_bytes(bytes(1000))
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "run"
    monkeypatch.setattr(checkpoint, "_write_checkpoint_files", full)
    with pytest.raises(DiskFull) as caught:
        train_in_process(toy_model, out)
    assert str(caught.value).startswith(
        f"disk full while saving step 1 to {out / 'checkpoints'}; no checkpoint was saved yet"
    )
    assert not list((out / "checkpoints").glob("*.tmp"))
    monkeypatch.undo()
    _rerun_then_resume_from_step_0(toy_model, out)


def test_resume_with_allow_changes_says_each_accepted_change_on_the_terminal(toy_model, finished, tmp_path):
    """Issue 35: a resume with --allow-changes went ahead with the new values and said nothing: one line per change."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "report.json").unlink()
    shutil.rmtree(out / "checkpoints" / "step-000003")
    auto_lr = json.loads((out / "plan.json").read_text())["learning_rate"]
    result = cli(*train_command(toy_model, out, "--resume", "--lr", "1e-3", "--allow-changes", "lr")[3:])
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "--allow-changes" in line]
    assert said == [
        f"--resume: continuing from step-000002 with the learning rate changed ({auto_lr:g} then, 0.001 now), "
        "as --allow-changes lr allows"
    ], result.stderr
