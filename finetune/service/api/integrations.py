"""A job's `integrations` -> the run's --report-to and --tracker-options, and back to the job object.

    POST /v1/fine_tuning/jobs {..., "integrations": [
        {"type": "wandb", "wandb": {"project": "p", "name": "n", "entity": "team", "tags": ["a"]}},   # OpenAI's
        {"type": "mlflow", "mlflow": {"experiment": "e", "run_name": "r"}},                          # ours
        {"type": "tensorboard"}]}                                                                    # ours

    run_settings_for(body.get("integrations"))  -> {"report_to": "wandb,mlflow,tensorboard", "tracker_options": "{...}"}
    integrations_of(job["run_settings"])        -> the list above, as the job object's `integrations`

The settings are stored with the job's other RunConfig settings and reach the trainer through the job's config
file, like every setting. They are names and tags only: a tracker's credentials (WANDB_API_KEY,
MLFLOW_TRACKING_TOKEN, ...) and where it is (MLFLOW_TRACKING_URI, WANDB_BASE_URL) come from the worker's
environment, so a caller can never point a worker's credentials at a server of its choosing.
"""

from __future__ import annotations

import json
from typing import Any

from finetune.service.api_error import APIError
from finetune.settings.tracker_options import OPTIONS, TRACKERS

MAX_INTEGRATIONS = 5  # OpenAI's limit
MAX_TEXT = 128
MAX_TAGS, MAX_TAG = 20, 64  # W&B's limit on a tag's length
REQUIRED = {"wandb": ("project",)}  # as OpenAI requires it


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, "invalid_value", param)


def _options(kind: str, given: Any, where: str) -> dict:
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise _bad(f"{where} must be an object.", where)
    known = OPTIONS[kind]
    for key, value in given.items():
        if key not in known:
            choices = ", ".join(known) or "none"
            raise _bad(f"{where} has no option {key!r} (its options: {choices}).", f"{where}.{key}")
        if known[key] == "text" and value is not None and not (isinstance(value, str) and 0 < len(value) <= MAX_TEXT):
            raise _bad(f"{where}.{key} must be text of 1 to {MAX_TEXT} characters.", f"{where}.{key}")
        if known[key] == "tags" and not (
            isinstance(value, list)
            and len(value) <= MAX_TAGS
            and all(isinstance(t, str) and 0 < len(t) <= MAX_TAG for t in value)
        ):
            raise _bad(f"{where}.{key} must be a list of at most {MAX_TAGS} tags of 1 to {MAX_TAG} characters.",
                       f"{where}.{key}")  # fmt: skip
    for key in REQUIRED.get(kind, ()):
        if not given.get(key):
            raise _bad(f"{where}.{key} is required.", f"{where}.{key}")
    return {key: value for key, value in given.items() if value is not None}


def run_settings_for(integrations: Any) -> dict[str, str]:
    """The RunConfig settings of a job-create body's `integrations` ({} for none); APIError 400 for a bad one."""
    if integrations is None:
        return {}
    if not isinstance(integrations, list) or len(integrations) > MAX_INTEGRATIONS:
        raise _bad(f"integrations must be a list of at most {MAX_INTEGRATIONS} objects.", "integrations")
    options: dict[str, dict] = {}
    for i, entry in enumerate(integrations):
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind not in TRACKERS:
            raise _bad(f"integrations[{i}].type must be one of {', '.join(TRACKERS)}, got {kind!r}.",
                       f"integrations[{i}].type")  # fmt: skip
        if kind in options:
            raise _bad(f"integrations has more than one {kind} entry.", f"integrations[{i}].type")
        extra = sorted(set(entry) - {"type", kind})
        if extra:
            raise _bad(f"integrations[{i}] has unknown key(s) {', '.join(extra)}.", f"integrations[{i}]")
        options[kind] = _options(kind, entry.get(kind), f"integrations[{i}].{kind}")
    if not options:
        return {}
    return {"report_to": ",".join(options), "tracker_options": json.dumps(options)}


def integrations_of(run_settings: dict | None) -> list[dict]:
    """The job object's `integrations`, from the settings stored with the job."""
    settings = run_settings or {}
    names = [name for name in (settings.get("report_to") or "").split(",") if name]
    options = json.loads(settings.get("tracker_options") or "{}")
    return [{"type": name, name: options.get(name, {})} for name in names]
