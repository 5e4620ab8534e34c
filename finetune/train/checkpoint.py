"""Resumable checkpoints: OUT/checkpoints/step-000120/ holding everything needed to continue exactly.

    weights      adapter (PEFT format, LoRA runs) or model (save_pretrained, full runs): trainable weights only
    optimizer.pt AdamW moments and step counts (torch.save of tensors; loaded with weights_only=True)
    rng.pt       torch / python RNG states (dropout, anything random), so a resumed run is bit-identical;
                 on several processes rank 0's, plus every rank's under "ranks"
    state.json   step, best validation so far, and the run's shape (to refuse resuming a different run)

The data position needs no file: the records of step k depend only on (seed, epoch, effective batch).
A checkpoint is written to a temporary folder and renamed, so readers never see half of one.

On several processes every rank calls save_checkpoint and rank 0 writes. A sharded (FSDP) model is
gathered first, so its checkpoint holds the full weights (save_pretrained) and the full optimizer state
(keyed by parameter name, torch.distributed.checkpoint's layout): it loads into any number of processes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from finetune.errors import UserError
from finetune.train.distributed import DistContext, gather_full_state, gather_objects, is_sharded, scatter_full_state

STEP_PREFIX = "step-"
STATE_FILES = ("optimizer.pt", "rng.pt", "state.json")  # everything in a checkpoint besides the weights


@dataclass
class TrainState:
    """What the loop knows besides the weights and the optimizer."""

    step: int = 0  # optimizer steps done
    best_step: int | None = None
    best_val_loss: float | None = None
    shape: dict = field(default_factory=dict)  # effective batch, total steps, devices, seed, records


def checkpoint_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"{STEP_PREFIX}{step:06d}"


def list_checkpoints(out: Path) -> list[Path]:
    root = out / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(STEP_PREFIX) and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def _save_weights(model, folder: Path, is_lora: bool, weights: dict | None = None) -> None:
    if is_lora:
        model.save_pretrained(folder)  # PEFT: adapter_model.safetensors + adapter_config.json
    else:
        model.save_pretrained(folder, safe_serialization=True, state_dict=weights)  # weights: gathered from FSDP


def _read_full_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    return state


def _load_weights(model, folder: Path, is_lora: bool) -> None:
    from safetensors.torch import load_file

    if is_lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        return
    state = _read_full_weights(folder)
    missing, unexpected = model.load_state_dict(state, strict=False)
    _check_match(model, folder, missing, unexpected)


def _check_match(model, folder: Path, missing: list[str], unexpected: list[str]) -> None:
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise UserError(f"checkpoint {folder} does not match the model (missing {missing[:3]}, extra {unexpected[:3]})")


def _rng_state() -> dict:
    version, internal, gauss = random.getstate()
    rng = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def _set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def save_checkpoint(
    out: Path, model, optimizer, state: TrainState, is_lora: bool, ctx: DistContext | None = None
) -> Path | None:
    """Every rank calls this (it gathers each rank's RNG, and a sharded model); rank 0 writes. The folder on rank 0."""
    ctx = ctx or DistContext()
    rngs = gather_objects(_rng_state(), ctx)
    weights, optimizer_state = gather_full_state(model, optimizer) if is_sharded(model) else (None, None)
    if not ctx.is_main:
        return None
    final = checkpoint_dir(out, state.step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save_weights(model, tmp, is_lora, weights)
    torch.save(optimizer.state_dict() if optimizer_state is None else optimizer_state, tmp / "optimizer.pt")
    torch.save({**rngs[0], "ranks": rngs} if len(rngs) > 1 else rngs[0], tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def read_state(folder: Path) -> TrainState:
    return TrainState(**json.loads((folder / "state.json").read_text()))


def load_checkpoint(folder: Path, model, optimizer, is_lora: bool, ctx: DistContext | None = None) -> TrainState:
    """Every rank calls this. Replicated models read the files on every rank (OUT must be visible to all);
    a sharded model is read by rank 0 and scattered to the others."""
    ctx = ctx or DistContext()
    if is_sharded(model):
        weights, optimizer_state = {}, {}  # only rank 0 reads: the scatter sends every rank its shards
        if ctx.is_main:
            weights = _read_full_weights(folder)
            names = set(model.state_dict())  # the scatter ignores names it does not know: check them here
            _check_match(model, folder, sorted(names - set(weights)), sorted(set(weights) - names))
            optimizer_state = torch.load(folder / "optimizer.pt", weights_only=True)
        scatter_full_state(model, optimizer, weights, optimizer_state)
    else:
        _load_weights(model, folder, is_lora)
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    rng = torch.load(folder / "rng.pt", weights_only=True)
    ranks = rng.get("ranks", [rng])
    # the same number of processes continues each rank's own random streams; another number starts
    # every rank from rank 0's (this only matters for LoRA dropout, off by default)
    _set_rng_state(ranks[ctx.rank] if len(ranks) == ctx.world_size else ranks[0])
    return read_state(folder)


def load_weights_only(folder: Path, model, is_lora: bool) -> None:
    """Put a checkpoint's weights into the model (to export the best one)."""
    _load_weights(model, folder, is_lora)


def copy_weights(folder: Path, dest: Path) -> None:
    """A full-model checkpoint's weights and config as a model folder (to export a sharded model's best)."""
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns(*STATE_FILES))


def prune_checkpoints(out: Path, keep_last: int, best_step: int | None) -> None:
    """Keep the last K checkpoints and the best one; delete the rest."""
    found = list_checkpoints(out)
    keep = {p.name for p in found[-keep_last:]}
    if best_step is not None:
        keep.add(checkpoint_dir(out, best_step).name)
    for path in found:
        if path.name not in keep:
            shutil.rmtree(path, ignore_errors=True)
