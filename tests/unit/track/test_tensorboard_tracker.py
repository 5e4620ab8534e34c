"""TensorBoard: a resumed run's steps replace the older run's steps past its checkpoint, as TensorBoard reads them."""

from __future__ import annotations

import importlib.util

import pytest

from finetune.track.tracker import Outputs, RunInfo, Step

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="finetune[tensorboard] is not installed"
)


def _write(out, steps: range, loss_of, resumed: bool) -> None:
    from finetune.track.tensorboard_tracker import TensorBoardTracker

    tracker = TensorBoardTracker()
    tracker.start(RunInfo(out.name, out, {"lr": 0.1, "auto.lr": "why"}, {}, {}, resumed))
    tracker.log_steps([Step(s, 1000.0 + s, {"train_loss": loss_of(s)}, {}) for s in steps])
    tracker.finish(Outputs([], {"steps_taken": steps[-1]}, ok=True))


def test_a_resumed_run_purges_the_steps_it_logs_again(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("FINETUNE_TENSORBOARD_DIR", raising=False)
    out = tmp_path / "run"
    _write(out, range(1, 6), lambda s: 10.0 + s, resumed=False)  # crashed after step 5, checkpoint at step 3
    _write(out, range(4, 7), lambda s: 20.0 + s, resumed=True)
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train_loss")] == [
        (1, 11.0), (2, 12.0), (3, 13.0), (4, 24.0), (5, 25.0), (6, 26.0)
    ]  # fmt: skip


def test_the_folder_can_be_shared_by_runs(tmp_path, monkeypatch):
    from finetune.track.tensorboard_tracker import log_dir

    run = RunInfo("one", tmp_path / "one", {}, {}, {}, False)
    assert log_dir(run) == tmp_path / "one" / "tensorboard"
    monkeypatch.setenv("FINETUNE_TENSORBOARD_DIR", str(tmp_path / "shared"))
    assert log_dir(run) == tmp_path / "shared" / "one"
