"""Requests without a valid key in the audit trail: recorded, but bounded (issue 42). Nobody answers for them (their
records name no tenant and no key: the operator's only), and a record can never be removed, so what anyone on the
network can send must not be able to fill the disk.

    limit = NoiseLimit()
    verdict = limit.admit(source)       # RECORD the request, MARK (record that recording stops for now), or SKIP

Per API process and minute, the first PER_SOURCE requests without a valid key from one address are recorded, and
PER_PROCESS in all. The first left out in a minute adds one `audit.unrecorded` record (the trail says where it
stopped, and until when); how many were left out goes to the server's log when the minute is over. Such a
record never keeps the object the caller named (a path parameter is whatever was typed, 60 KB of it); any record
keeps at most LIMITS' characters of each field (audit_trail.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

WINDOW_S = 60
PER_SOURCE = 10  # requests without a valid key recorded per caller's address and minute
PER_PROCESS = 60  # and in all, per API process and minute
RECORD, MARK, SKIP = "record", "mark", "skip"
log = logging.getLogger("finetune.service.storage.audit_trail")


class NoiseLimit:
    def __init__(
        self, per_source: int = PER_SOURCE, per_process: int = PER_PROCESS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_source, self.per_process, self.clock = per_source, per_process, clock
        self._lock = threading.Lock()  # records are written from the server's threads
        self._started = clock()
        self._recorded: Counter[str] = Counter()
        self._left_out = 0

    def admit(self, source: str) -> str:
        """Whether a request without a valid key from `source` is recorded now (RECORD), is the first left out this
        minute (MARK: write the marker record instead), or is left out (SKIP)."""
        with self._lock:
            self._roll()
            if self._recorded[source] < self.per_source and sum(self._recorded.values()) < self.per_process:
                self._recorded[source] += 1
                return RECORD
            self._left_out += 1
            return MARK if self._left_out == 1 else SKIP

    def until(self) -> float:
        """Seconds until this minute's recording starts again (for the marker)."""
        return max(0.0, self._started + WINDOW_S - self.clock())

    def _roll(self) -> None:
        if self.clock() - self._started < WINDOW_S:
            return
        if self._left_out:
            log.warning(
                "audit trail: %d request(s) without a valid key were not recorded one by one in the last %d s "
                "(at most %d per address and %d in all a minute, per API process)",
                self._left_out, WINDOW_S, self.per_source, self.per_process,
            )  # fmt: skip
        self._started, self._recorded, self._left_out = self.clock(), Counter(), 0
