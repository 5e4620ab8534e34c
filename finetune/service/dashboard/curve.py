"""What the dashboard draws, read from a job's run folder (the CLI's: plan.json, metrics.jsonl, report.json).

    run = RunView(folder)                 # cached per folder; re-read only when a file changed
    run.curve(points=800)                 # down-sampled columns for the charts (a 10,000-step run stays light)
    run.progress()                        # one row of the jobs list: step, epoch, ETA, tokens/s, sparkline, ...

Down-sampling keeps, for each of `points` buckets of steps, the rows with the lowest and the highest training
loss, so spikes survive; every evaluation row (validation loss) is always kept.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path

from finetune.report.metrics import read_metrics

SPARK_POINTS = 40
SERIES = ("step", "epoch", "learning_rate", "train_loss", "grad_norm", "tokens_per_s")
GENERAL, GENERAL_BASE = "general_val_loss", "general_val_loss_base"  # the forgetting curve (general_val)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def downsample(n: int, values: list[float | None], points: int) -> list[int]:
    """Indices of rows to keep: per bucket of rows the min and max of `values` (first and last row always)."""
    if n <= max(2, points * 2):
        return list(range(n))
    keep = {0, n - 1}
    size = n / points
    for b in range(points):
        lo, hi = int(b * size), min(n, int((b + 1) * size))
        bucket = [i for i in range(lo, hi) if values[i] is not None and math.isfinite(values[i])]
        if not bucket:
            keep.add(lo)
            continue
        keep.add(min(bucket, key=lambda i: values[i]))
        keep.add(max(bucket, key=lambda i: values[i]))
    return sorted(keep)


@dataclass
class _Cached:
    stamp: tuple | None = None
    value: object = None


@dataclass
class RunView:
    folder: Path
    _metrics: _Cached = field(default_factory=_Cached)
    _plan: _Cached = field(default_factory=_Cached)
    _report: _Cached = field(default_factory=_Cached)
    _retention: _Cached = field(default_factory=_Cached)
    _answers: dict = field(default_factory=dict)  # (what, argument) -> (stamps, answer)

    def _cached(self, cache: _Cached, name: str, load):
        path = self.folder / name
        stamp = _stamp(path)
        if stamp != cache.stamp:
            cache.value = load(path) if stamp is not None else None
            cache.stamp = stamp
        return cache.value

    def _stamps(self) -> tuple:
        names = ("metrics.jsonl", "plan.json", "report.json", "checkpoints")
        return tuple(_stamp(self.folder / name) for name in names)

    def _memo(self, what: str, argument: int, build):
        """A polled answer is rebuilt only when one of the run's files changed since it was built."""
        stamps = self._stamps()
        cached = self._answers.get((what, argument))
        if cached is not None and cached[0] == stamps:
            return cached[1]
        answer = build()
        self._answers[(what, argument)] = (stamps, answer)
        return answer

    def rows(self) -> list[dict]:
        return self._cached(self._metrics, "metrics.jsonl", read_metrics) or []

    def plan(self) -> dict | None:
        return self._cached(self._plan, "plan.json", _read_json)

    def report(self) -> dict | None:
        return self._cached(self._report, "report.json", _read_json)

    def retention(self) -> dict | None:
        """retention.json of `finetune eval RUN --retention`, when it ran on this run folder."""
        return self._cached(self._retention, "retention.json", _read_json)

    def checkpoint_steps(self) -> list[int]:
        steps = []
        for child in (self.folder / "checkpoints").glob("step-*"):
            try:
                steps.append(int(child.name.removeprefix("step-")))
            except ValueError:
                continue
        return sorted(steps)

    def best_step(self) -> int | None:
        report = self.report()
        if report and report.get("best_step") is not None:
            return report["best_step"]
        vals = [(r["val_loss"], r["step"]) for r in self.rows() if r.get("val_loss") is not None]
        return min(vals)[1] if vals else None

    def curve(self, points: int = 800) -> dict:
        return self._memo("curve", points, lambda: self._curve(points))

    def progress(self) -> dict:
        return self._memo("progress", 0, self._progress)

    def _curve(self, points: int) -> dict:
        rows = self.rows()
        keep = downsample(len(rows), [r.get("train_loss") for r in rows], points)
        kept = [rows[i] for i in keep]
        val = [r for r in rows if r.get("val_loss") is not None or r.get(GENERAL) is not None]
        plan = self.plan() or {}
        return {
            "object": "dashboard.curve",
            "steps_logged": len(rows),
            "points": len(kept),
            "downsampled": len(kept) < len(rows),
            "total_steps": plan.get("total_steps"),
            "steps_per_epoch": plan.get("steps_per_epoch"),
            "epochs": plan.get("epochs"),
            "train": {key: [r.get(key) for r in kept] for key in SERIES},
            "val": {
                "step": [r["step"] for r in val],
                "epoch": [r.get("epoch") for r in val],
                "val_loss": [r.get("val_loss") for r in val],
                **_general_series(rows, val),
            },
            "checkpoints": self.checkpoint_steps(),
            "best_step": self.best_step(),
        }

    def _progress(self) -> dict:
        rows = self.rows()
        plan = self.plan() or {}
        report = self.report()
        last = rows[-1] if rows else {}
        total = plan.get("total_steps")
        step = last.get("step", 0)
        recent = [r["tokens_per_s"] for r in rows[-10:] if r.get("tokens_per_s")]
        tokens_per_s = statistics.median(recent) if recent else None
        planned_tokens = plan.get("tokens_processed")
        tokens = None
        if report and report.get("tokens_processed") is not None:
            tokens = report["tokens_processed"]
        elif planned_tokens and total:
            tokens = round(planned_tokens * min(step, total) / total)
        eta = None
        if tokens_per_s and planned_tokens and total and step < total:
            eta = planned_tokens * (total - step) / total / tokens_per_s  # training time only, evaluations aside
        price = ((plan.get("cost") or {}).get("price_per_million_tokens")) or None
        cost = report.get("cost") if report and report.get("cost") is not None else None
        if cost is None and price and tokens is not None:
            cost = tokens / 1e6 * price
        spark_idx = downsample(len(rows), [r.get("train_loss") for r in rows], SPARK_POINTS // 2)
        return {
            "step": step,
            "total_steps": total,
            "epoch": last.get("epoch"),
            "epochs": plan.get("epochs"),
            "tokens_per_s": tokens_per_s,
            "eta_s": eta,
            "tokens": tokens,
            "cost": cost,
            "train_loss": last.get("train_loss"),
            "val_loss": next((r["val_loss"] for r in reversed(rows) if r.get("val_loss") is not None), None),
            "spark": [rows[i].get("train_loss") for i in spark_idx],
        }


def _general_series(rows: list[dict], val: list[dict]) -> dict:
    """The forgetting curve beside validation: general_val_loss at each evaluation, and the starting model's value
    (before step 1); nothing for a run without it."""
    if not any(r.get(GENERAL) is not None for r in val):
        return {}
    base = next((r[GENERAL_BASE] for r in rows if r.get(GENERAL_BASE) is not None), None)
    return {GENERAL: [r.get(GENERAL) for r in val], GENERAL_BASE: base}


class RunViews:
    """One RunView per run folder, so polling many jobs re-reads only what changed."""

    def __init__(self, limit: int = 512) -> None:
        self._views: dict[Path, RunView] = {}
        self._lock = threading.Lock()
        self._limit = limit

    def get(self, folder: Path) -> RunView:
        with self._lock:
            view = self._views.get(folder)
            if view is None:
                if len(self._views) >= self._limit:
                    self._views.pop(next(iter(self._views)))
                view = self._views[folder] = RunView(folder)
            return view
