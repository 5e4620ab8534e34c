"""The metrics log of a run: `OUT/metrics.jsonl`, one JSON object per optimizer step.

    log = MetricsLog("OUT/metrics.jsonl")
    log.truncate_after(resumed_step)  # on resume: forget the steps the checkpoint does not have
    log.append({"step": 1, "epoch": 0.01, "learning_rate": 2e-5, "train_loss": 2.31, ...})
    rows = read_metrics("OUT/metrics.jsonl")

Each append opens, writes one whole line, flushes and closes, so a reader polling the file (e.g.
`tail -f`) sees every step as soon as it is logged, and the log holds no open handle between steps.
A crash can still leave a torn last line: readers skip it, and a writer opening the log drops it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class MetricsLog:
    """Append-only JSON-lines log of per-step metrics."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_torn_tail()

    def append(self, row: dict) -> None:
        """Write `row` as one line and flush it to the OS, so live readers see it."""
        line = json.dumps(row) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()

    def truncate_after(self, step: int) -> int:
        """Drop every row with `row["step"] > step` (resuming from a checkpoint at `step`); returns how many.

        The file is rewritten to a temporary file and renamed over the log, so a reader never sees it half-written.
        """
        rows = read_metrics(self.path)
        kept = [row for row in rows if row["step"] <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in kept)
        os.replace(tmp, self.path)
        return len(rows) - len(kept)

    def _drop_torn_tail(self) -> None:
        # A line without its newline was cut by a crash; appending after it would glue two rows together.
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All complete rows of a metrics log, in file order; [] when the log does not exist yet.

    A torn last line (the writer is mid-append, or crashed) is skipped; a malformed line elsewhere
    is a real corruption and raises ValueError with its line number.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    lines = text.split("\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # the last piece has no newline after it: still being written
                break
            raise ValueError(f"{path}:{number}: not a JSON object ({e.msg})") from e
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        if "lr" in row and "learning_rate" not in row:  # a log written before the key took plan.json's name
            row["learning_rate"] = row.pop("lr")
        rows.append(row)
    return rows
