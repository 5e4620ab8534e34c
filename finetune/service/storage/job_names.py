"""What a job's row names beyond its columns: its `method.type`, and the name of the model it makes.

method_type(job)            "supervised" or "dpo" (preference tuning), as the job was created
fine_tuned_model_name(job)  ft:<base>:<tenant>:<suffix>:<job id> (ship/serving/service.py resolves it)
"""

from __future__ import annotations


def method_type(job: dict) -> str:
    return (job["method"] or {}).get("type") or "supervised"


def fine_tuned_model_name(job: dict) -> str:
    return f"ft:{job['model']}:{job['tenant']}:{job['suffix'] or ''}:{job['id']}"
