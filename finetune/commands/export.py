"""`finetune export RUN --out DIR [--merge | --adapter] [--dtype float32|bfloat16|float16] [--gguf [--gguf-type T]]`.

    --merge    (default for LoRA) the adapter folded into the base: a plain transformers folder, no peft needed
    --adapter  the PEFT adapter alone, its base recorded as an absolute path
    --gguf     also DIR/model.gguf (llama.cpp, Ollama, LM Studio), converted from the folder; --gguf-type
               f16 (default), bf16, f32 or q8_0
    a full run exports its model as it is; every export carries a model card (README.md)

The export is written to a temporary folder beside --out and renamed at the end: --out is never
overwritten, and an interrupted export leaves nothing half-written under its name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from finetune.bucket.remote import Remote, commit_folder
from finetune.bucket.uri import check_location, is_remote
from finetune.settings import caches
from finetune.settings.errors import UserError
from finetune.ship.export.card import model_card
from finetune.ship.export.gguf import DEFAULT_GGUF_TYPE, GGUF_TYPES, check_gguf_supported, write_gguf
from finetune.ship.export.write import copy_into_place, saved_dtype, share_like_other_files, write_adapter, write_model
from finetune.ship.run_folder import locate_weights
from finetune.train.remote_run import run_copy


def run_export(
    run: str,
    out: str,
    mode: str | None = None,
    dtype: str | None = None,
    checkpoint: int | None = None,
    gguf: bool = False,
    gguf_type: str | None = None,
    show=print,
) -> Path:
    """Export one run; returns the --out folder. `mode` is "merge", "adapter" or None (the run's natural kind).
    RUN or --out may be in a bucket (s3://…): the run is read from a copy on this node, the export written there
    first and uploaded, its manifest last."""
    if is_remote(out):
        return _export_to_bucket(run, out, mode, dtype, checkpoint, gguf, gguf_type, show)
    dest = Path(out)
    if dest.exists():
        raise UserError(f"{dest} already exists; export never overwrites: choose another --out")
    weights = locate_weights(str(run_copy(run, checkpoint)) if is_remote(run) else run, checkpoint)
    if mode == "adapter" and not weights.is_lora:
        raise UserError(f"{run} is a full fine-tuning run: there is no adapter to export (drop --adapter)")
    if gguf and mode == "adapter":
        raise UserError("--gguf converts a whole model: use it with --merge (or a full run), not --adapter")
    if gguf_type is not None and not gguf:
        raise UserError("--gguf-type says which weights go into model.gguf: add --gguf")
    kind = "adapter" if mode == "adapter" else ("merged" if weights.is_lora else "full")
    if gguf:
        gguf_type = gguf_type or DEFAULT_GGUF_TYPE
        if gguf_type not in GGUF_TYPES:
            raise UserError(f"--gguf-type must be one of {', '.join(GGUF_TYPES)}, got {gguf_type!r}")
        check_gguf_supported(weights)  # before any weights load: say plainly when it cannot be done

    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:  # before loading any weights: a folder that cannot be written is said at once
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise UserError(f"cannot create {dest}: {exc.strerror or exc}") from None
    try:
        if kind == "adapter":
            write_adapter(weights, tmp, dtype)
        else:
            chosen = dtype or saved_dtype(weights.base if weights.is_lora else str(weights.model))
            write_model(weights, tmp, chosen)
            if gguf:
                write_gguf(tmp, tmp / "model.gguf", gguf_type, name=Path(run).resolve().name, base=weights.base)
        (tmp / "README.md").write_text(model_card(weights, kind, gguf_type if gguf else None), encoding="utf-8")
        share_like_other_files(tmp)
        copy_into_place(tmp, dest)
    except FileExistsError:
        raise UserError(f"{dest} appeared while exporting; nothing was overwritten") from None
    except OSError as exc:  # a full disk, a folder gone read-only: nothing is left under --out
        raise UserError(f"could not write the export to {dest}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    what = {"adapter": "adapter", "merged": "merged model", "full": "model"}[kind]
    source = f"checkpoint step {checkpoint}" if checkpoint is not None else "final weights"
    also = f" and {dest / 'model.gguf'} ({gguf_type})" if gguf else ""
    show(f"exported the {what} ({source} of {run}) to {dest}{also}")
    return dest


def _export_to_bucket(run: str, out: str, mode, dtype, checkpoint, gguf, gguf_type, show) -> Path:
    """The export written on this node (in the cache), then uploaded to --out, its manifest.json last."""
    check_location(out, "--out")
    remote = Remote(out)
    if remote.listing():
        raise UserError(f"{out} already holds files; export never overwrites: choose another --out")
    staging = caches.temp_folder(caches.root() / "exports", "export")
    try:
        folder = run_export(run, str(staging / "export"), mode, dtype, checkpoint, gguf, gguf_type, show=lambda _: None)
        commit_folder(folder, remote)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    show(f"exported {run} to {out}")
    return Path(out)
