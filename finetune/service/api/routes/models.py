"""/v1/models: the base models registered with `--model NAME=...` and the caller's fine-tuned models; DELETE
removes a fine-tuned model of the caller's, as OpenAI's does (a base model cannot be deleted)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, Request

from finetune.service.api.auth import current_tenant
from finetune.service.api.deps import options_of, store_of
from finetune.service.api.objects import list_object, model_object
from finetune.service.api.openai_errors import not_found
from finetune.service.api_error import APIError
from finetune.service.options import ServiceOptions
from finetune.service.storage import bucket_copy, deletion, run_folders
from finetune.service.storage.store import Store
from finetune.service.storage.tombstones import ModelInUse

router = APIRouter(prefix="/v1", dependencies=[Depends(current_tenant)])
BASE_OWNER = "finetune"


def visible_models(store: Store, options: ServiceOptions, tenant: str, started: int) -> list[dict]:
    found = [model_object(name, started, BASE_OWNER) for name in options.models]
    found += [model_object(j["fine_tuned_model"], j["finished_at"] or j["created_at"], j["tenant"])
              for j in store.succeeded_jobs(tenant)]  # fmt: skip
    return found


def model_location(store: Store, options: ServiceOptions, name: str, tenant: str) -> str | None:
    """What a model name means for this tenant: a registered base's location, or a fine-tuned model's weights
    (adapter/ or model/ of its run). None for anything else (serving's resolver)."""
    if name in options.models:
        return options.models[name]
    for job in store.succeeded_jobs(tenant):
        if job["fine_tuned_model"] == name:
            bucket_copy.pull_weights(options, job["id"])  # --storage: this machine's copy, fetched once
            weights = run_folders.final_weights(Path(options.runs_dir) / job["id"])
            return str(weights) if weights else None
    return None


@router.get("/models")
def list_models(request: Request, tenant: str = Depends(current_tenant)) -> dict:
    items = visible_models(store_of(request), options_of(request), tenant, request.app.state.started)
    return list_object(items, False)


@router.get("/models/{model:path}")
def retrieve_model(model: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    for item in visible_models(store_of(request), options_of(request), tenant, request.app.state.started):
        if item["id"] == model:
            return item
    raise not_found("model", model, "model")


@router.delete("/models/{model:path}")
def delete_model(model: str, request: Request, tenant: str = Depends(current_tenant)) -> dict:
    """The model is gone for chat completions, retrieve and list; its job stays, and its final weights, its
    checkpoints (files and rows: each is a model too) and their GGUF files are removed from the data folder. DELETE
    the job to remove the rest of it (deletion.py)."""
    if model in options_of(request).models:
        raise APIError(
            403,
            f"{model!r} is a base model registered on this server; only fine-tuned models can be deleted.",
            "model_not_deletable",
            "model",
        )
    try:
        job = deletion.delete_model(options_of(request), store_of(request), tenant, model)
    except ModelInUse as exc:  # 400, not 409 (which the SDK retries), as for its job or its training file
        evaluation = exc.evaluation
        raise APIError(
            400,
            f"Model {model} is being evaluated ({evaluation['id']}, {evaluation['status']}): delete it once the "
            "evaluation has ended.",
            "model_in_use",
            "model",
        ) from None
    if job is None:
        raise not_found("model", model, "model")
    return {"id": model, "object": "model", "deleted": True}
