"""Launchers without a cluster: the flags' one-sentence errors, the local launcher's stop, and how a Ray run's exit
code is read from its ranks' ends (the real cluster is tests/service/test_ray.py)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.train.launchers import LocalLauncher
from finetune.train.ray_launch import RAY_FAILED, RankEnd, outcome
from finetune.train.trainer_run import TrainerRun

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_launcher_ray_without_ray_installed_is_one_sentence(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the extra
    train = ["train", str(EXAMPLES / "train.jsonl"), "--model", "m", "--out", str(tmp_path / "run"), "--devices", "2"]
    assert main([*train, "--launcher", "ray", "--ray-address", "10.0.0.1:6379"]) == 1
    line = _one_error_line(capsys)
    assert line == "error: --launcher ray needs Ray, which is not installed: pip install 'finetune[ray]'"
    assert main(["worker", "--data-dir", str(tmp_path / "d"), "--launcher", "ray", "--ray-address", "h:6379"]) == 1
    assert _one_error_line(capsys) == line
    assert not (tmp_path / "run").exists() and not (tmp_path / "d").exists()  # refused before anything was written


def test_ray_address_is_required_and_must_answer(monkeypatch, capsys, tmp_path):
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    worker = ["worker", "--data-dir", str(tmp_path / "d"), "--launcher", "ray"]
    assert main(worker) == 1
    assert "--launcher ray needs --ray-address ADDR" in _one_error_line(capsys)
    assert main([*worker, "--ray-address", "127.0.0.1:1"]) == 1  # nothing listens on port 1
    assert "--ray-address 127.0.0.1:1: nothing answers there" in _one_error_line(capsys)
    assert main(["worker", "--data-dir", str(tmp_path / "d"), "--ray-address", "127.0.0.1:6379"]) == 1
    assert _one_error_line(capsys) == "error: --ray-address goes with --launcher ray; drop it, or add --launcher ray"


def test_the_trainer_command_executes_the_plan():
    run = TrainerRun(Path("/r/job.plan.json"), Path("/r/job"), resume=True, allow_changes="lr")
    assert run.args() == ["train", "--plan", "/r/job.plan.json", "--out", "/r/job", "--json", "--resume",
                          "--allow-changes", "lr"]  # fmt: skip


def test_the_local_launcher_stops_with_sigterm_and_logs_the_output(tmp_path):
    """A stand-in trainer that says it is ready, then exits 143 on SIGTERM (as the real one does after its
    checkpoint)."""
    script = tmp_path / "trainer.py"
    script.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('stopped', flush=True), sys.exit(143)))\n"
        "print('ready', ' '.join(sys.argv[1:]), flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "trainer.log"
    trainer = LocalLauncher([sys.executable, str(script)]).start(
        TrainerRun(tmp_path / "p.json", tmp_path / "out", log=log, env={"X": "1"})
    )
    deadline = 30.0
    while "ready" not in (log.read_text() if log.exists() else "") and deadline > 0:
        assert trainer.wait(timeout=0.1) is None
        deadline -= 0.1
    trainer.stop()
    assert trainer.wait(timeout=30) == 143
    assert log.read_text().splitlines() == [f"ready train --plan {tmp_path / 'p.json'} --out {tmp_path / 'out'} --json",
                                            "stopped"]  # fmt: skip


# ----------------------------------------------------------------------------- a Ray run's exit code


def _end(rank: int, code: int | None, at: float, message: str | None = None, lost: bool = False, **kw) -> RankEnd:
    record = {"rank": rank, "time": at, "message": message, "lost_contact": lost} if message else None
    return RankEnd(rank, code, record, at, **kw)


def test_a_run_ends_as_its_first_real_cause():
    assert outcome([_end(0, 0, 1), _end(1, 0, 1)], stopped=False) == (0, None)
    # rank 1 failed with its own error; rank 0 only lost contact afterwards
    code, line = outcome([_end(0, 1, 2, "lost contact", lost=True), _end(1, 1, 3, "ValueError: boom")], False)
    assert (code, line) == (1, "error: rank 1 failed first: ValueError: boom")
    # rank 1's actor (process or node) was lost: a death to resume from, not an error of the run's
    code, line = outcome([_end(0, 1, 2, "lost contact", lost=True), _end(1, None, 1)], False)
    assert (code, line) == (-signal.SIGKILL, "error: rank 1 was lost with its Ray worker process or node")
    code, line = outcome([_end(0, 1, 2, "lost contact", lost=True), _end(1, -signal.SIGKILL, 1)], False)
    assert (code, line) == (-signal.SIGKILL, "error: rank 1 was killed by SIGKILL")


def test_ranks_ended_by_the_launcher_are_no_cause_and_a_stop_is_a_stop():
    # rank 1 failed; rank 0 hung in a collective and was killed by the launcher after the grace period
    ends = [_end(0, -signal.SIGKILL, 20, ended_by_us=True), _end(1, 1, 3, "ValueError: boom")]
    assert outcome(ends, False) == (1, "error: rank 1 failed first: ValueError: boom")
    # a stop: every rank checkpointed and said so (143), or was stopped before its handler was set (-SIGTERM)
    assert outcome([_end(0, 143, 1), _end(1, -signal.SIGTERM, 1)], stopped=True) == (143, None)
    # only lost contact on every rank, nobody seen dying: the network between them; worth another attempt
    code, line = outcome([_end(0, 1, 2, "lost contact", lost=True), _end(1, 1, 2, "lost contact", lost=True)], False)
    assert code == RAY_FAILED and line.startswith("error: the ranks lost contact with each other")
