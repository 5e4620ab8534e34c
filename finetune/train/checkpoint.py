"""Resumable checkpoints: OUT/checkpoints/step-000120/ holding everything needed to continue exactly.

    weights      adapter (PEFT format, LoRA runs) or model (save_pretrained, full runs): trainable weights only
    training_state/optimizer.safetensors + optimizer.json   AdamW's moments and step counts (tensors) and its
                 param_groups (JSON): no pickle, so a forged file can be malformed but never run code
    training_state/rng.safetensors + rng.json   torch / python RNG states (dropout, anything random), so a
                 resumed run is bit-identical; on several processes rank 0's, plus every rank's under "ranks"
    state.json   step, best validation so far, the run's shape and fingerprint (to refuse resuming a different run)
    manifest.json size and SHA-256 of every other file: written last, so a checkpoint without it is incomplete

The data position needs no file: the records of step k depend only on (seed, epoch, effective batch).
A checkpoint is written to `step-N.tmp`, every file and the folder are fsynced, the manifest goes in
last, and only then is the folder renamed to `step-N`: a crash or a full disk at any moment leaves
either the whole checkpoint or a `.tmp` folder that the next start removes. `--resume` verifies the
newest checkpoint against its manifest, and that its state files read back, and falls back to the newest good
one (see docs/reliability.md). A checkpoint of an earlier version (optimizer.pt, rng.pt: torch.save pickles) still
resumes: loaded with torch's weights-only unpickler, where anything but tensors makes the checkpoint damaged.

On several processes every rank calls save_checkpoint and rank 0 writes. A sharded (FSDP) model is
gathered first, so its checkpoint holds the full weights (save_pretrained) and the full optimizer state
(keyed by parameter name, torch.distributed.checkpoint's layout): it loads into any number of processes.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from finetune.settings.errors import UserError
from finetune.settings.manifest import MANIFEST, ManifestError, files_problem, read_manifest
from finetune.settings.manifest import fsync_path as _fsync_path
from finetune.settings.manifest import write_manifest as _write_manifest
from finetune.settings.wording import ref
from finetune.train.distributed import DistContext, gather_full_state, gather_objects, is_sharded, scatter_full_state
from finetune.train.state_files import (
    StateFileError,
    check_state_files,
    read_state_files,
    state_file_names,
    write_state,
)

STEP_PREFIX = "step-"
STATE_DIR = (
    "training_state"  # a folder of its own: nothing that globs a checkpoint's *.safetensors takes it for weights
)
LEGACY_STATE = ("optimizer.pt", "rng.pt")  # what checkpoints held before (torch.save pickles)
STATE_FILES = (STATE_DIR, *LEGACY_STATE, "state.json", MANIFEST)  # everything in a checkpoint besides the weights
TMP_SUFFIX = ".tmp"
DAMAGED_SUFFIX = ".damaged"


class DiskFull(UserError):
    """The disk filled while a checkpoint was written; the partial folder is gone, the older ones are intact."""


@dataclass
class TrainState:
    """What the loop knows besides the weights and the optimizer."""

    step: int = 0  # optimizer steps done
    best_step: int | None = None
    best_val_loss: float | None = None
    shape: dict = field(default_factory=dict)  # effective batch, total steps, devices, seed, records
    fingerprint: dict = field(default_factory=dict)  # what defines the run (finetune.settings.fingerprint)
    elapsed_s: float = 0.0  # training time of every session of the run so far, resumes included
    allowed_changes: list = field(default_factory=list)  # settings changed on --resume --allow-changes
    tokens_read: int | None = None  # tokens of the records the steps so far read (None: a checkpoint older than it)
    tokens_billed: int | None = None  # of them, those billed (rules/billing.py): a resumed run bills each once


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
        (folder / "README.md").unlink(missing_ok=True)  # PEFT's empty model-card template, not ours
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


def _is_disk_full(exc: BaseException, folder: Path) -> bool:
    """safetensors names a full disk in its own error; torch.save only says "unexpected pos": then ask the disk."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    if "No space left" in text or "StorageFull" in text or "os error 28" in text or "Disk quota" in text:
        return True
    try:
        stats = os.statvfs(folder if folder.exists() else folder.parent)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 1 << 20  # under 1 MiB left: whatever the error said, the disk is full


def last_good_step(out: Path) -> str:
    found = list_checkpoints(out)
    return f"the last good checkpoint is step {_step_of(found[-1])}" if found else "no checkpoint was saved yet"


def _step_of(folder: Path) -> int:
    return int(folder.name[len(STEP_PREFIX) :].split(".")[0])


def _write_checkpoint_files(tmp: Path, model, optimizer, state, is_lora, weights, optimizer_state, rngs) -> None:
    _save_weights(model, tmp, is_lora, weights)
    (tmp / STATE_DIR).mkdir()
    write_state(tmp / STATE_DIR, "optimizer", optimizer.state_dict() if optimizer_state is None else optimizer_state)
    write_state(tmp / STATE_DIR, "rng", {**rngs[0], "ranks": rngs} if len(rngs) > 1 else rngs[0])
    (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2))
    _write_manifest(tmp)


def _commit(tmp: Path, final: Path) -> None:
    """Rename tmp to final; an older folder of the same step (a run resumed from before it) is replaced whole."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(
    out: Path, model, optimizer, state: TrainState, is_lora: bool, ctx: DistContext | None = None
) -> Path | None:
    """Every rank calls this (it gathers each rank's RNG, and a sharded model); rank 0 writes. The folder on rank 0.

    A full disk removes the partial folder and raises DiskFull naming the last good checkpoint.
    """
    ctx = ctx or DistContext()
    rngs = gather_objects(_rng_state(), ctx)
    weights, optimizer_state = gather_full_state(model, optimizer) if is_sharded(model) else (None, None)
    if not ctx.is_main:
        return None
    final = checkpoint_dir(out, state.step)
    tmp = final.with_name(final.name + TMP_SUFFIX)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        _write_checkpoint_files(tmp, model, optimizer, state, is_lora, weights, optimizer_state, rngs)
        _commit(tmp, final)
    except Exception as exc:
        where = final.parent
        disk_full = _is_disk_full(exc, tmp)  # before the partial folder is removed and its space comes back
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full:
            raise DiskFull(
                f"disk full while saving step {state.step} to {where}; {last_good_step(out)}. "
                f"Free some space and run the same command with {ref('resume')}."
            ) from None
        if isinstance(exc, OSError):
            raise UserError(
                f"could not save step {state.step} to {where} ({exc.strerror or exc}); {last_good_step(out)}"
            ) from None
        raise
    return final


# ----------------------------------------------------------------------------- verify, fall back, clean


def verify_checkpoint(folder: Path) -> str | None:
    """None when every file matches the manifest; otherwise what is wrong, in a few words."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return "the folder is empty"
    if not (folder / MANIFEST).is_file():
        return f"it has no {MANIFEST} (its save never finished)"
    try:
        expected = read_manifest(folder)
    except ManifestError as exc:
        return str(exc)
    legacy = not any(name.startswith(f"{STATE_DIR}/") for name in expected)
    for name in ("state.json", *(LEGACY_STATE if legacy else _state_file_paths())):
        if name not in expected:
            return f"its {MANIFEST} does not list {name}"
    if not any(name.endswith(".safetensors") and not name.startswith(f"{STATE_DIR}/") for name in expected):
        return f"its {MANIFEST} lists no weights"
    if problem := files_problem(folder, expected):
        return problem
    # a file can match a manifest written along with it and still not be state: it must read back
    return _legacy_state_problem(folder) if legacy else _state_problem(folder)


def _state_file_paths() -> list[str]:
    return [f"{STATE_DIR}/{file}" for name in ("optimizer", "rng") for file in state_file_names(name)]


def _state_problem(folder: Path) -> str | None:
    for name in ("optimizer", "rng"):
        try:
            check_state_files(folder / STATE_DIR, name)
        except StateFileError as exc:
            return f"{STATE_DIR}/{exc}"
    return None


def _legacy_state_problem(folder: Path) -> str | None:
    """An earlier version's optimizer.pt / rng.pt, opened by torch's weights-only unpickler (memory-mapped: the
    tensors are not read). Anything but tensors in it is refused before it runs: the checkpoint is damaged."""
    for name in LEGACY_STATE:
        try:
            _load_legacy(folder / name, mmap=True)
        except Exception:  # whatever the unpickler says (its advice to turn weights_only off is not ours)
            return f"{name} does not load as plain tensors (forged or damaged; nothing in it was run)"
    return None


def _load_legacy(path: Path, mmap: bool = False):
    return torch.load(path, weights_only=True, mmap=mmap, map_location="cpu")


@dataclass
class ResumePoint:
    """The checkpoint --resume continues from (None: none is usable), and the damaged ones passed over."""

    folder: Path | None
    damaged: list[tuple[Path, str]]

    def message(self, out: Path) -> str:
        """One line for the user: what was found and where the run continues."""
        damaged = "; ".join(f"{p.name} is damaged: {why}" for p, why in self.damaged)
        if self.folder is not None:
            return f"{ref('resume')}: {damaged}; resuming from {self.folder.name}" if damaged else ""
        if damaged:
            return f"{ref('resume')}: no usable checkpoint in {out / 'checkpoints'} ({damaged}); starting from step 0"
        return f"{ref('resume')}: {out / 'checkpoints'} holds no checkpoint yet; starting from step 0"


def find_resume_point(out: Path) -> ResumePoint:
    """The newest checkpoint that passes verify_checkpoint, and every newer one that did not. Reads only."""
    damaged = []
    for folder in reversed(list_checkpoints(out)):
        problem = verify_checkpoint(folder)
        if problem is None:
            return ResumePoint(folder, damaged)
        damaged.append((folder, problem))
    return ResumePoint(None, damaged)


def set_aside_damaged(point: ResumePoint) -> None:
    """Rename the damaged checkpoints to step-N.damaged: kept for a look, never resumed from or counted again."""
    for folder, _ in point.damaged:
        aside = folder.with_name(folder.name + DAMAGED_SUFFIX)
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(folder, aside)


def remove_stale_tmp(out: Path) -> list[Path]:
    """Delete the half-written `.tmp` folders an earlier crash left behind; the list of what was removed."""
    candidates = [out / "adapter.tmp", out / "model.tmp"]
    root = out / "checkpoints"
    if root.is_dir():
        candidates += [p for p in root.iterdir() if p.name.endswith((TMP_SUFFIX, ".old"))]
    removed = [p for p in candidates if p.exists()]
    for path in removed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed


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
            optimizer_state = _read_state(folder, "optimizer")
        scatter_full_state(model, optimizer, weights, optimizer_state)
    else:
        _load_weights(model, folder, is_lora)
        optimizer.load_state_dict(_read_state(folder, "optimizer"))
    rng = _read_state(folder, "rng")
    ranks = rng.get("ranks", [rng])
    # the same number of processes continues each rank's own random streams; another number starts
    # every rank from rank 0's (this only matters for LoRA dropout, off by default)
    _set_rng_state(ranks[ctx.rank] if len(ranks) == ctx.world_size else ranks[0])
    return read_state(folder)


def _read_state(folder: Path, name: str):
    """The optimizer's or the RNG's state: from training_state/ (no pickle), or an earlier version's NAME.pt.
    verify_checkpoint has read both back already; a failure here (the file changed since) is one line too."""
    try:
        if (folder / STATE_DIR).is_dir():
            return read_state_files(folder / STATE_DIR, name)
        return _load_legacy(folder / f"{name}.pt")
    except Exception:  # never the unpickler's own advice, which is to turn its safety off
        raise UserError(
            f"{ref('resume')}: the {name} state of {folder} cannot be read back (forged or damaged; nothing in it was run); "
            f"move {folder.name} aside and resume again from the checkpoint before it"
        ) from None


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
