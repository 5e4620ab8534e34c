"""A run folder's files as the job's events and results: metrics rows -> metrics events, the report's diagnosis
-> an event in plain words, metrics.jsonl -> OpenAI's results CSV, a trainer's log -> the error it stopped on.
Plain functions of rows and files; no store, no process."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from finetune.settings.wording import render

RESULTS_COLUMNS = ["step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"]
# report.json's diagnosis kinds (finetune/report) that are no cause for concern
HEALTHY_DIAGNOSES = ("good_fit", "healthy_preference")
# a preference (DPO) run's own per-step metrics, carried into metrics events as the run logged them
PREFERENCE_METRICS = ("reward_margin", "reward_accuracy", "chosen_logp", "rejected_logp")


def metrics_event(row: dict, total: int | None) -> dict:
    val = row.get("val_loss")
    data = {
        "step": row["step"],
        "total_steps": total,
        "train_loss": row.get("train_loss"),
        "valid_loss": val,
        "full_valid_loss": val,  # our validation always covers the whole held-out set
        "train_mean_token_accuracy": None,
        "valid_mean_token_accuracy": None,
        "full_valid_mean_token_accuracy": None,
    }
    for name in PREFERENCE_METRICS:
        data |= {key: row[key] for key in (name, f"val_{name}") if row.get(key) is not None}
    message = f"Step {row['step']}/{total}: training loss={row.get('train_loss', float('nan')):.4f}"
    if val is not None:
        message += f", validation loss={val:.4f}"
    return {"message": message, "type": "metrics", "data": data}


def checkpoint_metrics(row: dict) -> dict:
    val = row.get("val_loss")
    found = {"step": row["step"], "train_loss": row.get("train_loss"), "valid_loss": val, "full_valid_loss": val}
    return {k: v for k, v in found.items() if v is not None}


def diagnosis_event(report: dict) -> dict | None:
    """The report's diagnosis and next step in plain words: info when the run went well, a warning otherwise."""
    diagnosis = report.get("diagnosis") or {}
    if not diagnosis.get("message"):
        return None
    kind = diagnosis.get("kind")
    text = " ".join(x for x in (diagnosis.get("message"), diagnosis.get("next_step")) if x)
    level = "info" if kind in HEALTHY_DIAGNOSES else "warn"
    return {"message": f"Diagnosis ({kind}): {text}", "level": level, "data": {"diagnosis": kind}}


def results_csv(rows: list[dict]) -> str:
    """OpenAI's results file: one row per step; accuracy columns stay empty (not measured)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RESULTS_COLUMNS)
    for row in rows:
        val = row.get("val_loss")
        writer.writerow([row["step"], f"{row['train_loss']:.5f}", "", "" if val is None else f"{val:.5f}", ""])
    return out.getvalue()


def trainer_error(log_path: Path, kind: str) -> str:
    """The trainer's own message for the error it stopped on, in an API caller's terms (its error file, which
    keeps the message's setting markers; else the last `error:` line of its log)."""
    try:
        written = json.loads(log_path.with_suffix(".error.json").read_text(encoding="utf-8"))
        return render(written["template"], "api", kind)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "the trainer failed"
    errors = [line[len("error: ") :] for line in lines if line.startswith("error: ")]
    return errors[-1] if errors else (lines[-1] if lines else "the trainer failed")
