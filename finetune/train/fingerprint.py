"""The fingerprint of a run: what defines it, recorded in every checkpoint so --resume cannot silently
train something else.

    now = run_fingerprint(config, plan)                  # a dict of plain values, stored in state.json
    changes = check_resume(saved, now, allowed=["lr"])    # UserError naming every change not allowed

A resume that changes the training or validation data, the model (its path or hub id, and a hash of its
config.json and weight-file headers), the method, LoRA rank or alpha, the learning rate or schedule,
the effective batch or the seed is refused. `--allow-changes lr,data` continues anyway for the settings
a checkpoint can carry over; the changes are returned so the report records them. Another method,
LoRA rank, effective batch or seed can never be allowed: the saved weights or the data order would not fit.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import UserError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit


@dataclass(frozen=True)
class Setting:
    label: str
    """How the message names it."""
    allowable: bool
    why_not: str = ""
    """Why --allow-changes cannot cover it."""


SETTINGS: dict[str, Setting] = {
    "data": Setting("the training data", True),
    "val-data": Setting("the validation data", True),
    "model": Setting("the model", True),
    "method": Setting("the method", False, "the checkpoint holds weights of the other method"),
    "lora-rank": Setting("the LoRA rank", False, "the checkpoint's adapter has another shape"),
    "lora-alpha": Setting("the LoRA alpha", True),
    "lora-train-head": Setting(
        "whether LoRA trains the output layer", False, "the checkpoint's adapter holds other weights"
    ),
    "lr": Setting("the learning rate", True),
    "schedule": Setting("the schedule", True),
    "effective-batch": Setting("the effective batch", False, "the records of every step depend on it"),
    "seed": Setting("the seed", False, "the split and the order of the records depend on it"),
    "objective": Setting("the objective (DPO's beta and SFT weight)", True),
}


@dataclass(frozen=True)
class Change:
    key: str
    before: object
    now: object

    def describe(self) -> str:
        setting = SETTINGS[self.key]
        text = f"{setting.label} changed ({_show(self.before)} then, {_show(self.now)} now)"
        return text if setting.allowable else f"{text}, which a checkpoint cannot carry over: {setting.why_not}"

    def to_dict(self) -> dict:
        return {"setting": self.key, "before": self.before, "now": self.now}


def file_sha256(path: str | Path) -> str:
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _file_identity(path: str) -> dict:
    return {"file": Path(path).name, "sha256": file_sha256(path)}


def _safetensors_header(path: Path) -> bytes:
    """The 8-byte length and the JSON header: the names, shapes and dtypes of the file's tensors."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return raw
        (length,) = struct.unpack("<Q", raw)
        return raw + f.read(min(length, MAX_HEADER_BYTES))


def model_identity(model: str) -> dict:
    """A local folder: its absolute path and a hash of config.json and the weight-file headers; a hub id: the id."""
    path = Path(model).expanduser()
    if not path.exists():
        return {"name": model}
    folder = path if path.is_dir() else path.parent
    digest = hashlib.sha256()
    for name in ("config.json",):
        if (folder / name).is_file():
            digest.update((folder / name).read_bytes())
    for weights in sorted(folder.glob("*.safetensors")):
        if not weights.name.startswith("adapter"):
            digest.update(weights.name.encode() + b"\0" + _safetensors_header(weights))
    return {"name": str(path.resolve()), "sha256": digest.hexdigest()}


def run_fingerprint(config, plan) -> dict:
    """What defines a run, from its RunConfig and its Plan (Auto's choices resolved): plain JSON values."""
    held_out = getattr(plan.data, "val_fraction", None) or 0.0
    val: dict = _file_identity(config.val_file) if config.val_file else {"held_out_fraction": held_out}
    return {
        "data": _file_identity(config.data),
        "val-data": val,
        "model": model_identity(config.model),
        "method": plan.method,
        "lora-rank": plan.lora_rank,
        "lora-alpha": plan.lora_alpha,
        "lora-train-head": plan.lora_train_head,
        "lr": plan.learning_rate,
        "schedule": {"decay": plan.schedule, "warmup_steps": plan.warmup_steps},
        "effective-batch": plan.effective_batch,
        "seed": plan.seed,
        "objective": {"type": plan.objective, "beta": plan.beta, "sft_weight": plan.sft_weight},
    }


def parse_allowed(names: str | Iterable[str] | None) -> list[str]:
    """`lr,data` (or a list) as keys of SETTINGS; UserError for a name it does not know."""
    if not names:
        return []
    items = names.split(",") if isinstance(names, str) else list(names)
    keys = [str(item).strip().replace("_", "-") for item in items if str(item).strip()]
    unknown = [key for key in keys if key not in SETTINGS]
    if unknown:
        known = ", ".join(key for key, setting in SETTINGS.items() if setting.allowable)
        raise UserError(f"--allow-changes: unknown setting {', '.join(unknown)}; it accepts {known}")
    return keys


def diff(saved: dict, now: dict) -> list[Change]:
    """Every setting recorded in both whose value differs (a setting the checkpoint never recorded is skipped)."""
    return [
        Change(key, saved[key], now[key])
        for key in SETTINGS
        if key in saved and key in now and _canonical(saved[key]) != _canonical(now[key])
    ]


def check_resume(saved: dict, now: dict, allowed: str | Iterable[str] | None, checkpoint: str) -> list[Change]:
    """The changes --allow-changes covers; UserError naming every change it does not cover."""
    allowed_keys = parse_allowed(allowed)
    changes = diff(saved, now)
    refused = [c for c in changes if c.key not in allowed_keys or not SETTINGS[c.key].allowable]
    if not refused:
        return changes
    what = "; ".join(c.describe() for c in refused)
    fixable = [c.key for c in refused if SETTINGS[c.key].allowable]
    hint = f", or pass --allow-changes {','.join(fixable)} to continue with the new value" if fixable else ""
    raise UserError(
        f"--resume: this run is not the one in {checkpoint}: {what}. "
        f"Resume with the same settings, start a new --out{hint}"
    )


def _canonical(value: object) -> str:
    if isinstance(value, dict) and "sha256" in value:
        value = {k: v for k, v in value.items() if k != "file"}  # a renamed data file with the same bytes is the same
    return json.dumps(value, sort_keys=True)


def _show(value: object) -> str:
    if isinstance(value, dict):
        if "sha256" in value:
            where = value.get("file") or value.get("name")
            return f"{where}, content {value['sha256'][:12]}"
        if "held_out_fraction" in value:
            return f"{value['held_out_fraction']:g} of the training file held out"
        if "decay" in value:
            return f"{value['decay']} with {value['warmup_steps']} warmup steps"
        if "name" in value:
            return str(value["name"])
        if "type" in value:  # the objective
            if value["type"] != "dpo":
                return str(value["type"])
            return f"dpo with beta {value['beta']:g} and SFT weight {value['sft_weight']:g}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
