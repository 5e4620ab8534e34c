"""A worker's presence in the workers registry (db.workers): registered when it starts, a heartbeat every few
seconds on a thread of its own (whatever its job is doing), `draining` once it is stopping, goodbye at the end.

    presence = WorkerPresence(store, name, options, devices=1, device_kind="cpu", stopping=worker.stopping)
    presence.start()
    ...
    presence.stop()          # says goodbye; a killed worker simply stops beating and is no longer live

`/healthz` counts the live ones (a beat within the lease time); `/readyz` lists what their jobs wait for (`waiting`).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable

from finetune.service.options import ServiceOptions
from finetune.service.storage.store import Store


class WorkerPresence(threading.Thread):
    def __init__(
        self,
        store: Store,
        name: str,
        options: ServiceOptions,
        devices: int | None,
        device_kind: str,
        stopping: threading.Event,
        speeds: dict[str, float] | None = None,
        waiting: Callable[[], dict | None] = lambda: None,
    ) -> None:
        super().__init__(name=f"presence-{name}", daemon=True)
        self.store, self.worker, self.options = store, name, options
        self.devices, self.device_kind = devices, device_kind
        self.speeds = speeds or {}  # what this machine measured before (train/speed.py), reported at registration
        self.stopping = stopping  # the worker's own: set, it finishes its job and takes no other (draining)
        self.waiting = waiting  # what its job waits for now ({"job", "message", "since"}), beaten for /readyz
        self.registered = False
        self._done = threading.Event()

    def start(self) -> None:
        self._beat()  # registered before the worker claims anything
        super().start()

    def run(self) -> None:
        while not self._done.wait(self.options.heartbeat_seconds):
            self._beat()

    def _beat(self) -> None:
        try:
            if not self.registered:
                host, pid = socket.gethostname(), os.getpid()
                self.store.workers.register(self.worker, host, pid, self.devices, self.device_kind, self.speeds)
                self.registered = True
            else:
                self.store.workers.heartbeat(self.worker, self.stopping.is_set(), self.waiting())
        except Exception as exc:  # a database hiccup: the next beat tries again
            print(f"worker {self.worker}: heartbeat failed: {type(exc).__name__}", file=sys.stderr)

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()
        try:
            self.store.workers.forget(self.worker)
        except Exception as exc:  # it stops beating anyway: no longer live after the lease time
            print(f"worker {self.worker}: could not say goodbye: {type(exc).__name__}", file=sys.stderr)
