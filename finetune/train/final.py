"""A finished run's weights: OUT/adapter (LoRA, PEFT format) or OUT/model (full), from its best or last checkpoint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from finetune.plan.plan import Plan
from finetune.train.checkpoint import checkpoint_dir, copy_weights, load_weights_only


def write_final_weights(model, tokenizer, out: Path, best_step: int | None, last_step: int, plan: Plan) -> Path:
    """Write adapter/ or model/ from the best checkpoint (validation on) or the last one; the folder written."""
    source = checkpoint_dir(out, best_step if best_step is not None else last_step)
    is_lora = plan.method == "lora"
    final = out / ("adapter" if is_lora else "model")
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if plan.shard == "full":  # the ranks hold pieces of the model; the checkpoint holds it whole
        copy_weights(source, tmp)
    else:
        load_weights_only(source, model, is_lora)
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final
