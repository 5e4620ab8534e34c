"""What the service reads of a job's run folder (RUNS/<job id>/, written by its trainer): the plan it executes,
the report it ends with, its metrics so far, its kept checkpoints' steps and its final weights' folder.

None of it loads torch (train/checkpoint.py would): the API and a worker read run folders, and neither trains.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_plan(run: Path) -> dict | None:
    try:
        return json.loads((run / "plan.json").read_text())
    except (OSError, ValueError):
        return None


def read_report(run: Path) -> dict | None:
    try:
        return json.loads((run / "report.json").read_text())
    except (OSError, ValueError):
        return None


def read_metrics(run: Path) -> list[dict]:
    """metrics.jsonl's complete lines (a line being written is skipped until it is whole)."""
    try:
        text = (run / "metrics.jsonl").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def checkpoint_steps(run: Path) -> list[int]:
    """Steps of the checkpoints in RUN/checkpoints/step-NNNNNN (train/checkpoint.py's layout)."""
    root = run / "checkpoints"
    if not root.is_dir():
        return []
    found = [p.name[len("step-") :] for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")]
    return sorted(int(step) for step in found if step.isdigit())


def final_weights(run: Path) -> Path | None:
    for name in ("adapter", "model"):
        if (run / name).is_dir():
            return run / name
    return None
