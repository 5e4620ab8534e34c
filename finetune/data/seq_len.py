"""The record length limit a run's data is fitted to: --max-seq-len, or Auto's choice from the records' lengths.

    choice = choose_max_seq_len(config, whole_lengths)     # Choice(value, reason); reason "" when given
    choice.value                                          # what the data path splits and cuts records to

Auto's rule is rules/auto.py's `auto_max_seq_len`; this module gathers what it looks at besides the lengths:
the model's context window (config.json) and whether one micro-batch of one record of a length fits the
device the plan sizes against (rules/memory.py, with the run's settings; not checked on the CPU or for a
model of unknown size, like every memory choice of the plan). The data path makes this choice, once; the plan
takes it as the data summary gives it (plan/build.py). No torch import.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from finetune.models.facts import load_model_facts
from finetune.rules.auto import MAX_AUTO_RANK, Choice, auto_max_seq_len
from finetune.rules.memory import estimate_memory, resolve_device
from finetune.rules.model_facts import ModelFacts
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import UserError


def model_context_length(model: str | None, facts: ModelFacts | None = None) -> int | None:
    """The model's context window in tokens (`max_position_embeddings` of its config.json); None when unknown.

    ModelFacts carries no context length yet: it is read here, from a local folder or config.json only.
    """
    known = getattr(facts, "context_length", None)
    if known:
        return int(known)
    if not model:
        return None
    path = Path(model).expanduser()
    config_path = path / "config.json" if path.is_dir() else path
    if config_path.suffix != ".json" or not config_path.is_file():
        return None
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    if "max_position_embeddings" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]
    value = cfg.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def length_fits(config: RunConfig, facts: ModelFacts | None, rows_per_record: int = 1) -> Callable[[int], bool] | None:
    """Whether one micro-batch of one record of a given length fits the device's memory, with the run's method
    and gradient checkpointing when it may be used; None when it cannot be checked (as build_plan's batch rule)."""
    device, assumed, _ = resolve_device(config.gpu)
    if facts is None or device.memory_bytes is None:
        return None
    method = config.trained_weights
    # Auto picks the rank after the length (from the fitted data's tokens): size for the largest rank it picks
    rank = (MAX_AUTO_RANK if config.lora_rank == AUTO else config.lora_rank) if method == "lora" else None
    dtype = config.dtype if config.dtype != AUTO else "bf16"
    shard = "full" if config.shard != "none" and config.devices > 1 and method == "full" else "none"
    checkpointing = config.gradient_checkpointing is not False
    head = config.lora_train_head is True

    def fits(length: int) -> bool:
        estimate = estimate_memory(
            facts, method, rows_per_record, length, checkpointing, rank, config.devices, shard, device, assumed,
            dtype, head,
        )  # fmt: skip
        return estimate.fits_device is not False

    return fits


def choose_max_seq_len(
    config: RunConfig, lengths: np.ndarray, rows_per_record: int = 1, facts: ModelFacts | None = None
) -> Choice[int]:
    """--max-seq-len when given (reason ""), else Auto's choice from the records' whole `lengths` (any order), with
    the model's `facts` (read here when the caller has none at hand)."""
    if config.max_seq_len != AUTO:
        return Choice(int(config.max_seq_len), "")
    if facts is None:
        try:
            facts = load_model_facts(config.model)
        except UserError:
            facts = None  # the plan reports an unreadable model in its own words
    device, _, _ = resolve_device(config.gpu)
    return auto_max_seq_len(
        np.sort(np.asarray(lengths, dtype=np.int64)),
        model_context_length(config.model, facts),
        length_fits(config, facts, rows_per_record),
        device.name,
    )
