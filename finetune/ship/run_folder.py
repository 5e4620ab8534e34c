"""Find a run's weights (final or a checkpoint) and its base model, and load them for generation.

    weights = locate_weights("runs/one")                 # adapter/ (LoRA) or model/ (full)
    weights = locate_weights("runs/one", checkpoint=120) # checkpoints/step-000120/
    model, tokenizer = load_for_generation(weights)

Used by `finetune export`, `finetune chat`, `finetune eval RUN` and the serving engine, so all of them
agree on which folder is the tuned model and which base it sits on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from finetune.data.tokenize import load_tokenizer
from finetune.placement.where import Placement, of_run
from finetune.settings.errors import UserError


@dataclass(frozen=True)
class RunWeights:
    """Where one model of a run lives on disk."""

    run: Path
    base: str  # the base model: an absolute folder, or a hub id
    adapter: Path | None  # LoRA: the PEFT adapter folder
    model: Path | None  # full fine-tuning: the model folder
    tokenizer: str  # a folder holding the tokenizer (the run's, else the base's)
    step: int | None  # the checkpoint's step; None for the final weights
    trust_remote_code: bool = False  # the run loaded its base with the model's own code (plan.json's settings)

    @property
    def is_lora(self) -> bool:
        return self.adapter is not None


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def team_system_of(run: str | Path) -> str | None:
    """The team's system message the run was trained with (`team_system`), for the team's prompts at inference; None
    when it had none."""
    return read_json(Path(run) / "plan.json").get("team_system") or None


def model_file(model: str, name: str) -> Path | None:
    """One file of a model folder, or of a hub id from the local cache (no network); None if neither has it."""
    found = Path(model) / name
    if found.exists():
        return found
    from huggingface_hub import try_to_load_from_cache  # no network: the run's base is in the cache

    try:
        cached = try_to_load_from_cache(model, name)
    except ValueError:  # not a hub id either
        cached = None
    return Path(cached) if isinstance(cached, str) else None


def is_run_folder(path: str | Path) -> bool:
    folder = Path(path)
    return folder.is_dir() and ((folder / "plan.json").exists() or (folder / "report.json").exists())


def resolve_base(name: str, run: Path) -> str:
    """The base model as a path that works from any directory (an existing folder), else the name (a hub id).

    Older runs recorded the base as given on the command line, possibly relative to where training
    ran: try it as given, then next to the run folder and its parents.
    """
    given = Path(name).expanduser()
    candidates = [given] if given.is_absolute() else [given, *(parent / given for parent in run.resolve().parents)]
    for candidate in candidates:
        if (candidate / "config.json").exists():
            return str(candidate.resolve())
    if given.is_absolute() or name.startswith((".", "~")):
        raise UserError(f"the base model {name!r} of {run} is not there any more; restore it to export or load the run")
    return name  # a hub id


def _base_of(run: Path, adapter: Path | None) -> str:
    name = None
    if adapter is not None:
        name = read_json(adapter / "adapter_config.json").get("base_model_name_or_path")
    name = name or read_json(run / "plan.json").get("model")
    if not name:
        raise UserError(f"{run}: cannot tell which base model this run was trained from (no plan.json)")
    return resolve_base(str(name), run)


def checkpoint_steps(run: str | Path) -> list[int]:
    """The steps of the checkpoints kept in a run folder, in order."""
    from finetune.train.checkpoint import list_checkpoints  # torch: the dashboard reads run folders without it

    return [int(p.name.split("-")[-1]) for p in list_checkpoints(Path(run))]


def locate_weights(run: str | Path, checkpoint: int | None = None) -> RunWeights:
    """The final weights of a run (adapter/ or model/), or those of one kept checkpoint."""
    folder = Path(run)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: pass the --out folder of a `finetune train` run")
    final_adapter, final_model = folder / "adapter", folder / "model"
    if checkpoint is None:
        source = final_adapter if (final_adapter / "adapter_config.json").exists() else final_model
        if not (source / "config.json").exists() and not (source / "adapter_config.json").exists():
            raise UserError(f"{folder} holds no adapter/ or model/: is it a finished `finetune train` run?")
    else:
        from finetune.train.checkpoint import checkpoint_dir  # torch: the dashboard reads run folders without it

        source = checkpoint_dir(folder, checkpoint)
        if not source.is_dir():
            kept = ", ".join(map(str, checkpoint_steps(folder))) or "none"
            raise UserError(f"{folder} has no checkpoint at step {checkpoint} (kept: {kept})")
    adapter = source if (source / "adapter_config.json").exists() else None
    base = _base_of(folder, adapter)
    tokenizer_home = next(
        (p for p in (source, final_adapter, final_model) if (p / "tokenizer_config.json").exists()), None
    )
    return RunWeights(
        run=folder,
        base=base,
        adapter=adapter,
        model=None if adapter else source,
        tokenizer=str(tokenizer_home) if tokenizer_home else base,
        step=checkpoint,
        trust_remote_code=bool(read_json(folder / "plan.json").get("settings", {}).get("trust_remote_code")),
    )


def load_for_generation(weights: RunWeights, placement: Placement | None = None):
    """(model, tokenizer) ready to generate: a LoRA adapter on its base, or the full model, in the run's precision on
    its device (plan.json's; `placement` to choose another, e.g. export's fp32)."""
    # torch: the dashboard and the model card read run folders without it
    from finetune.placement.load import load_adapted, load_placed

    placement = placement or of_run(weights.run)
    tokenizer = load_tokenizer(weights.tokenizer)
    if weights.adapter is not None:
        # the base grows to the run's tokenizer when training added tokens (ChatML on a base without a template)
        model = load_adapted(weights.base, str(weights.adapter), placement, len(tokenizer), weights.trust_remote_code)
    else:
        model = load_placed(str(weights.model), placement, trust_remote_code=weights.trust_remote_code)
    model.eval()
    return model, tokenizer
