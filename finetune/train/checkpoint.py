"""Resumable checkpoints: OUT/checkpoints/step-000120/ holding everything needed to continue exactly.

    weights      adapter (PEFT format, LoRA runs) or model (save_pretrained, full runs): trainable weights only
    optimizer.pt AdamW moments and step counts (torch.save of tensors; loaded with weights_only=True)
    rng.pt       torch / python RNG states (dropout, anything random), so a resumed run is bit-identical
    state.json   step, best validation so far, and the run's shape (to refuse resuming a different run)

The data position needs no file: the records of step k depend only on (seed, epoch, effective batch).
A checkpoint is written to a temporary folder and renamed, so readers never see half of one.
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

STEP_PREFIX = "step-"


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


def _save_weights(model, folder: Path, is_lora: bool) -> None:
    if is_lora:
        model.save_pretrained(folder)  # PEFT: adapter_model.safetensors + adapter_config.json
    else:
        model.save_pretrained(folder, safe_serialization=True)


def _load_weights(model, folder: Path, is_lora: bool) -> None:
    from safetensors.torch import load_file

    if is_lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        return
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise UserError(f"checkpoint {folder} does not match the model (missing {missing[:3]}, extra {unexpected[:3]})")


def save_checkpoint(out: Path, model, optimizer, state: TrainState, is_lora: bool) -> Path:
    final = checkpoint_dir(out, state.step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save_weights(model, tmp, is_lora)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    version, internal, gauss = random.getstate()
    rng = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_checkpoint(folder: Path, model, optimizer, is_lora: bool) -> TrainState:
    _load_weights(model, folder, is_lora)
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    rng = torch.load(folder / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return TrainState(**json.loads((folder / "state.json").read_text()))


def load_weights_only(folder: Path, model, is_lora: bool) -> None:
    """Put a checkpoint's weights into the model (to export the best one)."""
    _load_weights(model, folder, is_lora)


def prune_checkpoints(out: Path, keep_last: int, best_step: int | None) -> None:
    """Keep the last K checkpoints and the best one; delete the rest."""
    found = list_checkpoints(out)
    keep = {p.name for p in found[-keep_last:]}
    if best_step is not None:
        keep.add(checkpoint_dir(out, best_step).name)
    for path in found:
        if path.name not in keep:
            shutil.rmtree(path, ignore_errors=True)
