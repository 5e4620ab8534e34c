"""Rows -> the OpenAI JSON objects (every field openapi marks required is always sent)."""

from __future__ import annotations

from finetune.service.api.integrations import integrations_of
from finetune.service.storage.job_names import fine_tuned_model_name, method_type
from finetune.service.storage.store import Page
from finetune.service.storage.usage import job_usage

ORGANIZATION = "org-local"


def file_object(row: dict) -> dict:
    return {
        "object": "file",
        "id": row["id"],
        "bytes": row["bytes"],
        "created_at": row["created_at"],
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def _hyperparameters(row: dict) -> dict:
    if row.get("resolved"):
        return dict(row["resolved"])
    kind = method_type(row)
    asked = ((row["method"] or {}).get(kind) or {}).get("hyperparameters") or {}
    openai_keys = ("n_epochs", "batch_size", "learning_rate_multiplier", *(("beta",) if kind == "dpo" else ()))
    return {k: asked.get(k, "auto") for k in openai_keys} | asked


def job_object(row: dict) -> dict:
    hyper = _hyperparameters(row)
    return {
        "object": "fine_tuning.job",
        "id": row["id"],
        "model": row["model"],
        "created_at": row["created_at"],
        "finished_at": row["finished_at"],
        "fine_tuned_model": row["fine_tuned_model"],
        "organization_id": ORGANIZATION,
        "result_files": list(row["result_files"] or []),
        "status": row["status"],
        "training_file": row["training_file"],
        "validation_file": row["validation_file"],
        "hyperparameters": hyper,
        "trained_tokens": row["trained_tokens"],
        "error": row["error"],
        "seed": row["seed"],
        "estimated_finish": row["estimated_finish"],
        "integrations": integrations_of(row.get("run_settings")),
        "metadata": row["metadata"],
        "suffix": row["suffix"],
        "attempts": row["attempts"],
        "method": {"type": method_type(row), method_type(row): {"hyperparameters": hyper}},
        "usage": job_usage(row),  # ours: the estimate once planned, the actual once ended (storage/usage.py)
        "billing": ((row.get("report") or {}).get("billing")),  # ours: what trained_tokens bills, and why
    } | _tombstone(row)


def _tombstone(row: dict) -> dict:
    """Ours, on a deleted job only: when, and what was removed (deletion.py)."""
    if row.get("deleted_at") is None:
        return {}
    return {"deleted": True, "deleted_at": row["deleted_at"], "removed": list(row.get("removed") or [])}


def event_object(row: dict) -> dict:
    return {
        "object": "fine_tuning.job.event",
        "id": f"ftevent-{row['row']}",
        "created_at": row["created_at"],
        "level": row["level"],
        "message": row["message"],
        "type": row["type"],
        "data": row["data"],
    }


def checkpoint_object(row: dict, job: dict) -> dict:
    base = job["fine_tuned_model"] or fine_tuned_model_name(job)
    return {
        "object": "fine_tuning.job.checkpoint",
        "id": row["id"],
        "created_at": row["created_at"],
        "fine_tuned_model_checkpoint": f"{base}:ckpt-step-{row['step']}",
        "fine_tuning_job_id": job["id"],
        "step_number": row["step"],
        "metrics": row["metrics"] or {},
    }


def model_object(name: str, created: int, owned_by: str) -> dict:
    return {"object": "model", "id": name, "created": created, "owned_by": owned_by}


def list_object(items: list[dict], has_more: bool) -> dict:
    return {
        "object": "list",
        "data": items,
        "has_more": has_more,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
    }


def page_object(page: Page, make) -> dict:
    return list_object([make(r) for r in page.rows], page.has_more)
