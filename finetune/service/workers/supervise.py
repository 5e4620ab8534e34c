"""`finetune serve`'s embedded workers: started, watched, restarted when one dies, stopped with serve.

    supervisor = Supervisor(start_worker, count=2)     # start_worker() -> subprocess.Popen
    supervisor.start()
    ...
    supervisor.stop()                                   # SIGTERM each (its job checkpoints and is queued again)

A worker that exits while serve runs is restarted after a pause that doubles at each death (1 s, 2 s, 4 s, ...,
at most 60 s) and goes back to 1 s once a worker has lived a minute; every death and restart is one line on
serve's stderr, with the exit code.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

FIRST_PAUSE_S = 1.0
LONGEST_PAUSE_S = 60.0
STABLE_AFTER_S = 60.0  # a worker that lived this long died of something new: the pause starts again at 1 s
CHECK_EVERY_S = 0.5


def next_pause(previous: float | None, lived_s: float) -> float:
    """The pause before restarting a worker that lived `lived_s` seconds (`previous`: the pause before it)."""
    if previous is None or lived_s >= STABLE_AFTER_S:
        return FIRST_PAUSE_S
    return min(previous * 2, LONGEST_PAUSE_S)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class _Slot:
    number: int
    process: subprocess.Popen | None = None
    started: float = 0.0
    pause: float | None = None  # the last pause before a restart; None: never restarted (or stable since)
    restart_at: float | None = None


class Supervisor:
    def __init__(self, start_worker: Callable[[], subprocess.Popen], count: int, log: TextIO | None = None) -> None:
        self.start_worker = start_worker
        self.slots = [_Slot(number + 1) for number in range(count)]
        self.log = log or sys.stderr
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [slot.process for slot in self.slots if slot.process is not None]

    def start(self) -> None:
        for slot in self.slots:
            self._launch(slot)
        if self.slots:
            self._thread.start()

    def _launch(self, slot: _Slot) -> None:
        slot.process, slot.started, slot.restart_at = self.start_worker(), time.monotonic(), None

    def _say(self, text: str) -> None:
        print(f"finetune serve: {text}", file=self.log, flush=True)

    def _watch(self) -> None:
        while not self._stopping.wait(CHECK_EVERY_S):
            with self._lock:
                if self._stopping.is_set():
                    return
                for slot in self.slots:
                    self._check(slot, time.monotonic())

    def _check(self, slot: _Slot, now: float) -> None:
        if slot.restart_at is not None:
            if now >= slot.restart_at:
                self._launch(slot)
                self._say(f"worker {slot.number} restarted (pid {slot.process.pid})")
            return
        code = slot.process.poll() if slot.process is not None else None
        if code is None:
            return
        slot.pause = next_pause(slot.pause, now - slot.started)
        slot.restart_at = now + slot.pause
        self._say(
            f"worker {slot.number} (pid {slot.process.pid}) died ({describe_exit(code)}); "
            f"restarting it in {slot.pause:g} s"
        )

    def stop(self, timeout: float = 180) -> None:
        """Stop watching, then SIGTERM every worker (each checkpoints its job and queues it again), then wait."""
        with self._lock:
            self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        running = [p for p in self.processes if p.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
