"""Serving inside the job service: what a model name means for a tenant, and mounting the router.

    ft:<base>:<tenant>:<suffix>:<job id>                 a succeeded job's final weights (job.fine_tuned_model)
    ft:<base>:<tenant>:<suffix>:<job id>:ckpt-step-N     one of its kept checkpoints, as OpenAI names them
    <registered name>                                    a base model registered with `finetune serve --model`

Only the caller's own succeeded jobs are searched, so another tenant's model answers 404 like one that
does not exist.
"""

from __future__ import annotations

from typing import Any

from finetune.settings.errors import UserError
from finetune.ship.run_folder import locate_weights, resolve_base, team_system_of
from finetune.ship.serving.engine import Engine, ModelLocation
from finetune.ship.serving.router import Resolver, chat_completions_router

CHECKPOINT_MARK = ":ckpt-step-"
MAX_MODELS = 4  # bases + adapters held in memory by `finetune serve` before the least recently used goes


def split_checkpoint(name: str) -> tuple[str, int | None]:
    """("ft:...:job", 120) for "ft:...:job:ckpt-step-120"; (name, None) for anything else."""
    model, mark, step = name.rpartition(CHECKPOINT_MARK)
    if mark and model and step.isdigit():
        return model, int(step)
    return name, None


def job_resolver(store: Any, settings: Any) -> Resolver:
    """Resolver over the service's store (succeeded jobs per tenant) and its registered base models."""

    def resolve(name: str, tenant: str) -> ModelLocation | None:
        if name in settings.models:
            return ModelLocation(resolve_base(settings.models[name], settings.data_dir))
        model, step = split_checkpoint(name)
        job = next((j for j in store.succeeded_jobs(tenant) if j["fine_tuned_model"] == model), None)
        if job is None:
            return None
        try:
            weights = locate_weights(settings.runs_dir / job["id"], step)
        except UserError:  # a checkpoint that was pruned, or weights removed from disk
            return None
        system = team_system_of(weights.run)  # trained with the team's system message: the team's requests get it
        if weights.adapter is not None:
            return ModelLocation(weights.base, str(weights.adapter), system)
        return ModelLocation(str(weights.model), system=system)

    return resolve


def mount_chat_completions(app: Any, store: Any, settings: Any, tenant: Any, max_models: int = MAX_MODELS) -> Engine:
    """Add `POST /v1/chat/completions` to the service's app; returns the engine (kept on app.state.engine)."""
    engine = Engine(max_models=max_models)
    app.state.engine = engine
    app.include_router(chat_completions_router(job_resolver(store, settings), engine, tenant=tenant))
    return engine
