"""`finetune export RUN --out DIR [--merge | --adapter] [--dtype float32|bfloat16|float16] [--gguf]`.

    --merge    (default for LoRA) the adapter folded into the base: a plain transformers folder, no peft needed
    --adapter  the PEFT adapter alone, its base recorded as an absolute path
    a full run exports its model as it is; every export carries a model card (README.md)

The export is written to a temporary folder beside --out and renamed at the end: --out is never
overwritten, and an interrupted export leaves nothing half-written under its name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from finetune.errors import UserError
from finetune.export.card import model_card
from finetune.export.write import copy_into_place, saved_dtype, share_like_other_files, write_adapter, write_model
from finetune.run_folder import locate_weights


def run_export(
    run: str,
    out: str,
    mode: str | None = None,
    dtype: str | None = None,
    checkpoint: int | None = None,
    gguf: bool = False,
    show=print,
) -> Path:
    """Export one run; returns the --out folder. `mode` is "merge", "adapter" or None (the run's natural kind)."""
    dest = Path(out)
    if dest.exists():
        raise UserError(f"{dest} already exists; export never overwrites: choose another --out")
    weights = locate_weights(run, checkpoint)
    if mode == "adapter" and not weights.is_lora:
        raise UserError(f"{run} is a full fine-tuning run: there is no adapter to export (drop --adapter)")
    if gguf and mode == "adapter":
        raise UserError("--gguf converts a whole model: use it with --merge (or a full run), not --adapter")
    kind = "adapter" if mode == "adapter" else ("merged" if weights.is_lora else "full")
    if gguf:
        from finetune.export.gguf import check_gguf_supported

        check_gguf_supported(weights.base)  # before any work: say plainly when it cannot be done

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
                from finetune.export.gguf import write_gguf

                write_gguf(tmp, tmp / "model.gguf")
        (tmp / "README.md").write_text(model_card(weights, kind), encoding="utf-8")
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
    show(f"exported the {what} ({source} of {run}) to {dest}")
    return dest
