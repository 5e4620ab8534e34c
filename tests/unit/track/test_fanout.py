"""The fan-out to trackers: each on its own thread, never blocking the loop, one warning on failure, bounded end."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import pytest

from finetune.track import base
from finetune.track.base import Trackers, flatten, redact, run_files, split_row
from finetune.track.tracker import Outputs, RunInfo, Step

CONFIG = {"out": "/tmp/runs/one", "resume": False, "report_to": "fake", "tracker_options": None}
PLAN = {"total_steps": 3, "memory": {"total": 5}, "auto": {"lr": "because"}, "warnings": [{"code": "x"}]}


class Recorder:
    name = "fake"

    def __init__(self, fail_on: str | None = None, block: threading.Event | None = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.fail_on = fail_on
        self.block = block

    def _call(self, kind: str, payload) -> None:
        if self.block is not None:
            self.block.wait()
        self.calls.append((kind, payload))
        if kind == self.fail_on:
            raise ConnectionError("http://alice:hunter2-secret@tracker.example/api refused")

    def start(self, run: RunInfo) -> None:
        self._call("start", run)

    def log_steps(self, steps: list[Step]) -> None:
        self._call("steps", steps)

    def finish(self, outputs: Outputs) -> None:
        self._call("finish", outputs)


def _row(step: int, **extra) -> dict:
    return {"step": step, "epoch": step / 10, "learning_rate": 1e-3, "train_loss": 2.0 - step / 10, **extra}


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "finetune" and r.levelno == logging.WARNING]


def test_every_row_reaches_the_tracker_in_order_and_the_run_ends_cleanly(tmp_path, caplog):
    tracker = Recorder()
    trackers = Trackers([tracker])
    trackers.start(CONFIG | {"out": str(tmp_path / "run-a")}, PLAN)
    seen = []
    on_step = trackers.chain(seen.append)
    for step in range(1, 6):
        on_step(_row(step, checkpoint_s=0.5))
    trackers.finish(tmp_path, {"steps_taken": 5})
    kinds = [kind for kind, _ in tracker.calls]
    assert kinds[0] == "start" and kinds[-1] == "finish"
    steps = [s for kind, batch in tracker.calls if kind == "steps" for s in batch]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5] and len(seen) == 5  # the caller's on_step still runs
    assert steps[0].metrics == {"epoch": 0.1, "learning_rate": 1e-3, "train_loss": 1.9}  # checkpoint timings stay out
    run = tracker.calls[0][1]
    assert run.name == "run-a" and run.params["memory.total"] == 5 and run.params["auto.lr"] == "because"
    assert tracker.calls[-1][1].ok is True and _warnings(caplog) == []


def test_no_trackers_cost_nothing():
    trackers = Trackers()
    on_step = print
    assert trackers.chain(on_step) is on_step and trackers.chain(None) is None
    trackers.start(CONFIG, PLAN)
    trackers.log_step(_row(1))
    trackers.finish("/nowhere", {})


def test_a_failing_tracker_warns_once_without_its_credentials_and_is_switched_off(caplog, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "marker-key-0123456789")
    tracker = Recorder(fail_on="steps")
    trackers = Trackers([tracker])
    trackers.start(CONFIG, PLAN)
    for step in range(1, 20):
        trackers.log_step(_row(step, note="marker-key-0123456789"))
        time.sleep(0.002)
    trackers.finish("/nowhere", {})
    messages = _warnings(caplog)
    assert len(messages) == 1, messages
    assert "--report-to fake" in messages[0] and "training goes on without fake" in messages[0]
    assert "hunter2" not in messages[0] and "alice" not in messages[0] and "***@tracker.example" in messages[0]
    assert [kind for kind, _ in tracker.calls].count("steps") == 1  # nothing is sent after the first failure
    assert "finish" not in [kind for kind, _ in tracker.calls]


def test_a_hanging_tracker_never_blocks_the_loop_and_finish_keeps_its_bound(caplog, monkeypatch):
    monkeypatch.setattr(base, "QUEUE_SIZE", 5)
    release = threading.Event()
    tracker = Recorder(block=release)  # stuck in its first call, as on a server that never answers
    trackers = Trackers([tracker])
    trackers.start(CONFIG, PLAN)
    started = time.perf_counter()
    for step in range(1, 101):
        trackers.log_step(_row(step))
    assert time.perf_counter() - started < 0.5  # 100 rows put aside in well under a second
    started = time.perf_counter()
    trackers.finish("/nowhere", {}, timeout=1.0)
    assert time.perf_counter() - started < 2.0
    messages = _warnings(caplog)
    assert any("did not finish within 1 s" in m for m in messages), messages
    # the queue holds 5: the start (unless the thread took it already) and the first rows; the rest are dropped
    assert any(re.search(r"fell behind: 9[56] step\(s\) were not sent", m) for m in messages), messages
    release.set()


def test_a_run_that_stops_before_its_end_closes_its_trackers_as_failed():
    tracker = Recorder()
    trackers = Trackers([tracker])
    trackers.start(CONFIG, PLAN)
    trackers.log_step(_row(1))
    trackers._abandon()  # what atexit calls when finish never came
    assert tracker.calls[-1][0] == "finish" and tracker.calls[-1][1].ok is False
    trackers.finish("/nowhere", {})  # closing twice does nothing
    assert [kind for kind, _ in tracker.calls].count("finish") == 1


def test_rows_split_into_numbers_and_notes_and_the_plan_flattens():
    step = split_row(_row(4, warning="loss spike", val_loss=None, target_tokens=12, checkpoint_cpu_s=1.0), 5.0)
    assert step.step == 4 and step.time == 5.0
    assert step.metrics == {"epoch": 0.4, "learning_rate": 1e-3, "train_loss": 1.6, "target_tokens": 12.0}
    assert step.notes == {"warning": "loss spike"}
    assert flatten(PLAN) == {"total_steps": 3, "memory.total": 5, "auto.lr": "because", "warnings": '[{"code": "x"}]'}


def test_the_forgetting_curve_reaches_the_trackers_as_metrics():
    """general_val_loss (each evaluation) and general_val_loss_base (step 1's row) are numbers like val_loss."""
    first = split_row(_row(1, general_val_loss_base=0.61), 1.0)
    evaluated = split_row(_row(2, val_loss=1.2, general_val_loss=0.64), 2.0)
    assert first.metrics["general_val_loss_base"] == 0.61
    assert evaluated.metrics["general_val_loss"] == 0.64 and evaluated.metrics["val_loss"] == 1.2
    assert not first.notes and not evaluated.notes


def test_run_files_are_the_report_the_curve_and_the_card(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "loss_curve.png").write_bytes(b"png")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "README.md").write_text("card")
    files = run_files(tmp_path, {"final_weights": str(tmp_path / "adapter")})
    assert files == [
        (tmp_path / "report.json", ""),
        (tmp_path / "loss_curve.png", ""),
        (tmp_path / "adapter" / "README.md", "adapter"),
    ]
    assert run_files(Path(tmp_path / "none"), {}) == []


@pytest.mark.parametrize("name", ["MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "WANDB_API_KEY", "MY_SECRET"])
def test_redact_hides_every_credential_of_the_environment(monkeypatch, name):
    monkeypatch.setenv(name, "value-of-a-credential")
    assert redact(f"failed with value-of-a-credential in {name}") == f"failed with *** in {name}"
