"""Write a run's model as a folder others can use: merged (LoRA folded into the base), full, or adapter alone."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from finetune.data.prompting import stop_ids
from finetune.data.tokenize import load_tokenizer
from finetune.placement.where import Placement
from finetune.ship.run_folder import RunWeights, load_for_generation, model_file, read_json

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def saved_dtype(model: str) -> str:
    """The dtype a model folder (or a hub id, from the local cache) was saved in; float32 if unknown.

    Exports keep it unless told otherwise: a merged model in its base's dtype, a full run's model as it is.
    """
    config_file = model_file(model, "config.json")
    config = read_json(config_file) if config_file else {}
    saved = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return saved if saved in DTYPES else "float32"


def _end_of_turn_generation_config(model, tokenizer) -> None:
    """Generation stops where training taught the model to stop: the end-of-turn token."""
    ids = stop_ids(tokenizer)
    model.generation_config.eos_token_id = ids[0] if len(ids) == 1 else ids
    if tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def write_model(weights: RunWeights, dest: Path, dtype: str) -> None:
    """A transformers folder: the LoRA adapter merged into the base (in fp32, then cast), or the full model."""
    model, tokenizer = load_for_generation(weights, Placement("cpu", "fp32"))  # merged exactly, on the CPU
    if weights.is_lora:
        model = model.merge_and_unload()  # W + (alpha / r) B A, computed in fp32
    model = model.to(DTYPES[dtype])
    _end_of_turn_generation_config(model, tokenizer)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def write_adapter(weights: RunWeights, dest: Path, dtype: str | None) -> None:
    """The PEFT adapter alone, its base recorded as a path that resolves from any directory."""
    from safetensors.torch import load_file, save_file

    assert weights.adapter is not None
    dest.mkdir(parents=True, exist_ok=True)
    config = read_json(weights.adapter / "adapter_config.json")
    config["base_model_name_or_path"] = weights.base
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(weights.adapter / "adapter_model.safetensors")
    if dtype is not None:
        tensors = {name: t.to(DTYPES[dtype]) for name, t in tensors.items()}
    save_file(tensors, dest / "adapter_model.safetensors", metadata={"format": "pt"})
    load_tokenizer(weights.tokenizer).save_pretrained(dest)


def share_like_other_files(folder: Path) -> None:
    """Give every file the permissions the user's umask gives new files.

    safetensors writes through a private temporary file (mode 0600): left so, a teammate or a serving
    container running as another user could read the model card but not the weights.
    """
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~mask)


def copy_into_place(tmp: Path, out: Path) -> None:
    """Move a finished export to --out; refuse to replace anything that appeared meanwhile."""
    if out.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        raise FileExistsError(out)
    tmp.rename(out)
