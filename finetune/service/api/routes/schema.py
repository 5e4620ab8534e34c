"""GET /v1/fine_tuning/hyperparameters/schema (our addition): every hyperparameter an API caller may set, as a JSON
Schema generated from RunConfig's declarations (finetune/settings/registry.py), and the labels of plan.json's keys.

The dashboard builds its New job form and names settings in its messages from this (and the actions messages point
at: an evaluation's route becomes its Evaluate button); any client may use it.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from finetune.plan.plan import derived_labels
from finetune.service.api.auth import current_tenant
from finetune.settings.registry import hyperparameter_schema, plan_labels, setting, settings
from finetune.settings.wording import ACTIONS

router = APIRouter(prefix="/v1/fine_tuning", dependencies=[Depends(current_tenant)])


@router.get("/hyperparameters/schema")
def schema() -> dict:
    return {
        "object": "fine_tuning.hyperparameters.schema",
        "schema": hyperparameter_schema(),
        "job_parameters": {s.about.api_param: s.label for s in settings() if s.about.api_param} | {"suffix": "Suffix"},
        "plan_labels": plan_labels() | derived_labels() | {k: setting(k).label for k in ("method", "val_fraction")},
        # what a message tells its reader to do: the API's wording and the dashboard's (wording.py ACTIONS)
        "actions": {name: {"api": w["api"], "dashboard": w["dashboard"]} for name, w in ACTIONS.items()},
    }
