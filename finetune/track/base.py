"""The fan-out to the trackers of a run, each on its own thread, so that none can stop or slow training.

    trackers = start_trackers(config, plan)   # rank 0, once plan.json is written
    on_step = trackers.chain(on_step)          # every metrics row goes to each tracker too
    trackers.finish(out, report)               # after report.json, loss_curve.png and the model card

Each tracker gets a thread and a bounded queue. `log_step` only puts the row in each queue (never blocks: when a
queue is full, the row is dropped and counted); the thread sends what has piled up in one call. The first
exception a tracker raises is one warning on the `finetune` logger, and that tracker is switched off for the rest
of the run: a server that is down stays down for minutes, and retrying quietly would only pile up work and hold
the run's end. `finish` gives the trackers at most FINISH_TIMEOUT_S seconds together (FINETUNE_TRACKER_TIMEOUT
overrides it) to send what is left and the run's files, and never raises. A run that stops before `finish` (an
error, a signal) closes its trackers at exit, marked as failed, within a few seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune.settings.tracker_options import parse_tracker_options, tracker_names
from finetune.track.mlflow_tracker import MlflowTracker
from finetune.track.tensorboard_tracker import TensorBoardTracker
from finetune.track.tracker import Outputs, RunInfo, Step, Tracker
from finetune.track.wandb_tracker import WandbTracker

log = logging.getLogger("finetune")

QUEUE_SIZE = 10_000  # steps a tracker may fall behind before rows are dropped
BATCH = 500  # rows sent in one call at most
FINISH_TIMEOUT_S = 10.0
ABANDON_TIMEOUT_S = 3.0  # at exit, after a run that did not reach finish
ON_STEP_ONLY = ("checkpoint_s", "checkpoint_cpu_s")  # on_step's rows carry them; metrics.jsonl does not
SECRET_NAME = re.compile(r"KEY|TOKEN|PASSWORD|SECRET|CREDENTIAL|AUTH|^MLFLOW_TRACKING_USERNAME$", re.IGNORECASE)
URL_USER = re.compile(r"(://)[^/@\s]+@")


# ----------------------------------------------------------------------------- what is sent


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"memory": {"total": 1}} -> {"memory.total": 1}; lists as JSON text (every tracker takes scalars)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat |= flatten(value, f"{name}.")
        elif isinstance(value, list | tuple):
            flat[name] = json.dumps(value, default=str)
        else:
            flat[name] = value
    return flat


def split_row(row: dict, at: float) -> Step:
    metrics, notes = {}, {}
    for key, value in row.items():
        if key == "step" or key in ON_STEP_ONLY or value is None:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics[key] = float(value)
        else:
            notes[key] = str(value)
    return Step(int(row["step"]), at, metrics, notes)


def run_files(out: Path, report: dict) -> list[tuple[Path, str]]:
    """report.json, loss_curve.png and the model card (OUT/adapter|model/README.md), those that exist."""
    found = [(out / "report.json", ""), (out / "loss_curve.png", "")]
    weights = report.get("final_weights")
    if weights:
        found.append((Path(weights) / "README.md", Path(weights).name))
    return [(path, folder) for path, folder in found if path.is_file()]


def redact(text: str) -> str:
    """A message without the credentials of this process's environment (nor a user:password@ in a URL)."""
    for name, value in os.environ.items():
        if SECRET_NAME.search(name) and len(value) >= 6:
            text = text.replace(value, "***")
    return URL_USER.sub(r"\1***@", text)


def _describe(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return redact(f"{type(exc).__name__}: {first}"[:300])


# ----------------------------------------------------------------------------- one tracker on its thread


class _Channel:
    """A tracker, its queue and its thread: ("start", RunInfo), ("steps", Step)..., ("finish", Outputs)."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.queue: queue.Queue = queue.Queue(QUEUE_SIZE)
        self.failed = False
        self.dropped = 0
        self.thread = threading.Thread(target=self._run, name=f"finetune-track-{tracker.name}", daemon=True)
        self.thread.start()

    def send(self, kind: str, payload: Any) -> None:
        if self.failed:
            return
        try:
            self.queue.put_nowait((kind, payload))
        except queue.Full:  # the tracker is far behind: never make the loop wait for it
            self.dropped += 1

    def close(self, outputs: Outputs, deadline: float) -> bool:
        """Ask the thread to finish, wait until the deadline; True when it did."""
        if self.thread.is_alive():
            try:
                self.queue.put(("finish", outputs), timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:
                return False
            self.thread.join(max(0.0, deadline - time.monotonic()))
        return not self.thread.is_alive()

    def _run(self) -> None:
        held = None
        while True:
            kind, payload = held or self.queue.get()
            held = None
            if kind == "steps":  # what piled up meanwhile goes in one call
                payload = [payload]
                while len(payload) < BATCH:
                    try:
                        item = self.queue.get_nowait()
                    except queue.Empty:
                        break
                    if item[0] != "steps":
                        held = item
                        break
                    payload.append(item[1])
            if not self.failed:
                try:
                    self._deliver(kind, payload)
                except Exception as exc:  # any failure of the tracker or its library: warn once, then stop sending
                    self.failed = True
                    log.warning(
                        "--report-to %s: %s; training goes on without %s", self.tracker.name,
                        _describe(exc), self.tracker.name,
                    )  # fmt: skip
            if kind == "finish":
                return

    def _deliver(self, kind: str, payload: Any) -> None:
        if kind == "start":
            self.tracker.start(payload)
        elif kind == "steps":
            self.tracker.log_steps(payload)
        else:
            self.tracker.finish(payload)


# ----------------------------------------------------------------------------- the fan-out


class Trackers:
    """Every tracker of a run (none: every call does nothing)."""

    def __init__(self, trackers: list[Tracker] | None = None) -> None:
        self._channels = [_Channel(t) for t in trackers or []]
        self._done = False
        if self._channels:
            atexit.register(self._abandon)

    @classmethod
    def named(cls, report_to: str | None) -> Trackers:
        """The trackers of a report_to value; their libraries are imported on their own threads, in their `start`."""
        made: list[Tracker] = []
        for name in tracker_names(report_to):
            if name == "tensorboard":
                made.append(TensorBoardTracker())
            elif name == "mlflow":
                made.append(MlflowTracker())
            elif name == "wandb":
                made.append(WandbTracker())
        return cls(made)

    def start(self, config: dict, plan: dict) -> None:
        """Open each tracker's run: the plan with Auto's values (and `auto.<setting>`: why) as parameters."""
        out = Path(config["out"])
        options = parse_tracker_options(config.get("tracker_options"), config.get("report_to"))
        params = flatten(plan)
        for channel in self._channels:
            mine = options.get(channel.tracker.name, {})
            run = RunInfo(out.name, out, params, plan, mine, bool(config.get("resume")))
            channel.send("start", run)

    def log_step(self, row: dict) -> None:
        if not self._channels:
            return
        step = split_row(row, time.time())
        for channel in self._channels:
            channel.send("steps", step)

    def chain(self, on_step: Callable[[dict], None] | None) -> Callable[[dict], None] | None:
        """`on_step` that also hands each row to the trackers (`on_step` itself when there are none)."""
        if not self._channels:
            return on_step

        def both(row: dict) -> None:
            self.log_step(row)
            if on_step:
                on_step(row)

        return both

    def finish(self, out: str | Path, report: dict, timeout: float | None = None) -> None:
        """Send the run's files and close every tracker, within `timeout` seconds in all; never raises."""
        self._close(Outputs(run_files(Path(out), report), report, ok=True), timeout or _finish_timeout())

    def _abandon(self) -> None:
        self._close(Outputs([], {}, ok=False), ABANDON_TIMEOUT_S)

    def _close(self, outputs: Outputs, timeout: float) -> None:
        if self._done or not self._channels:
            return
        self._done = True
        with contextlib.suppress(Exception):
            atexit.unregister(self._abandon)
        deadline = time.monotonic() + timeout
        for channel in self._channels:
            try:
                name = channel.tracker.name
                if not channel.close(outputs, deadline) and not channel.failed:
                    log.warning(
                        "--report-to %s did not finish within %.0f s; the run ends without waiting for it",
                        name, timeout,
                    )  # fmt: skip
                if channel.dropped:
                    log.warning("--report-to %s fell behind: %d step(s) were not sent", name, channel.dropped)
            except Exception as exc:  # never let a tracker fail the run at its very end
                log.warning("--report-to: closing a tracker failed: %s", _describe(exc))


def _finish_timeout() -> float:
    try:
        return max(0.0, float(os.environ.get("FINETUNE_TRACKER_TIMEOUT", FINISH_TIMEOUT_S)))
    except ValueError:
        return FINISH_TIMEOUT_S


def start_trackers(config, plan) -> Trackers:
    """The run's trackers (--report-to), started: `config` a RunConfig, `plan` its Plan."""
    trackers = Trackers.named(config.report_to)
    trackers.start(config.to_dict(), plan.to_dict())
    return trackers
