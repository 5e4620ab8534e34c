"""What long work outside the training loop says while it runs: self-replay's generation, the retention check,
`finetune eval`. An estimate before it starts, then a line per batch.

    tell("The base model answered 64 of up to 96 general prompts (41 s)", {"answered": 64, "prompts": 96})
    with counting("Retention check"):            # a line per batch of whatever answers inside it
        ...; batch_done("general prompts", 64, 265)

Each line goes to the `finetune` log (the command line prints it) with its numbers under the record's PROGRESS
attribute: a service worker that plans a job in its own thread turns those into the job's events
(service/workers/preparation.py). A child process a worker starts (`finetune eval` for an evaluation) has
PROGRESS_FILE_ENV set: each line is also appended there as JSON, and the worker adds new ones to the job's events at
each heartbeat (service/workers/evaluation.py). No torch here: the service reads this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

log = logging.getLogger("finetune")
PROGRESS = "finetune_progress"  # a log record's attribute holding a progress line's numbers
PROGRESS_FILE_ENV = "FINETUNE_PROGRESS_FILE"
_counting: ContextVar[tuple[str, float] | None] = ContextVar("finetune_counting", default=None)


def tell(message: str, data: dict) -> None:
    """One progress line: to the log, and to the worker's progress file when there is one."""
    log.info("%s", message, extra={PROGRESS: data})
    path = os.environ.get(PROGRESS_FILE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"message": message, "data": data}) + "\n")


@contextlib.contextmanager
def counting(label: str) -> Iterator[None]:
    """Inside it, each finished batch (`batch_done`) says so, under `label`, with the time since it began."""
    token = _counting.set((label, time.perf_counter()))
    try:
        yield
    finally:
        _counting.reset(token)


def batch_done(what: str, done: int, total: int) -> None:
    """'Retention check: 128 of 265 general prompts answered (52 s)', inside `counting`; nothing outside it."""
    current = _counting.get()
    if current is not None:
        label, began = current
        seconds = time.perf_counter() - began
        tell(f"{label}: {done} of {total} {what} answered ({seconds:.0f} s)",
             {"what": what, "done": done, "total": total, "seconds": round(seconds, 1)})  # fmt: skip


def read_new(path: Path, offset: int) -> tuple[list[dict], int]:
    """The whole lines appended to a progress file since `offset` (a byte offset), and the offset after them."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    events = []
    for line in data[:end].splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and isinstance(entry.get("message"), str):
                events.append({"message": entry["message"], "data": entry.get("data")})
    return events, offset + end


@contextlib.contextmanager
def progress_lines(stream=None) -> Iterator[None]:
    """The `finetune` log's lines (an estimate, a line per batch) on `stream` (stderr) while a command runs, unless
    something prints them already; stdout keeps the command's results (and --json its JSON alone)."""
    logger = logging.getLogger("finetune")
    if logger.handlers:
        yield
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
