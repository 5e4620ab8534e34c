"""Adapter scale after training (WiSE-FT: base + scale x update), measured on the run and written into its adapter.

    scale = scale_adapter(model, tokenizer, plan, objective, val, pad_id, final, device, bf16)  # None when off
    scale["value"], scale["reason"], scale["measured"]       # report.json's `adapter_scale`

After the run's final adapter is written (OUT/adapter, its best checkpoint), the same in-memory model is measured at
a few scales (rules/adapter_scale.GRID, and 0, the base, for reference): (a) the team's validation loss, computed as
the loop computes val_loss (the sum of the objective's loss over every validation record / the sum of its target
tokens, in the loop's groups), and (b) a general probe: the same loss on held-out general prompts answered by the
base itself (ship/eval/replay.base_answers(held_out=True): never trained on, and never the retention check's set
in finetune/ship/eval/general/, which judges the choice and must not make it). rules/adapter_scale.choose_scale keeps
the smallest scale that keeps the fit.

One change carries the scale everywhere the adapter goes: PEFT computes each layer's scaling as lora_alpha / r, so
the scale multiplies `lora_alpha` in OUT/adapter/adapter_config.json; export (merged, GGUF), serving, chat and eval
all load that file, so all of them see the same model. An output layer trained in full beside the adapter
(lora_train_head) is moved the same way, base + scale x (trained - base), in adapter_model.safetensors; rows added
for new special tokens stay as trained (the base has no meaning for them to return to). Checkpoints keep the
unscaled adapter (a resume continues the training as it was); scale 1 leaves the adapter byte for byte as written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from finetune.data.tokenize import ChatTokenizer
from finetune.data.types import Message, Record
from finetune.plan.plan import Plan
from finetune.rules.adapter_scale import (
    FULL_RUN,
    GRID,
    NO_VALIDATION,
    PREFERENCE_RUN,
    REFERENCE,
    choose_scale,
    tolerance,
)
from finetune.rules.auto import Choice
from finetune.settings.config import AUTO
from finetune.settings.errors import UserError
from finetune.ship.eval.replay import base_answers

log = logging.getLogger("finetune")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
GENERAL_PROBE = "held-out general prompts answered by the base model (never trained on; not the retention set)"


def scale_adapter(
    model, tokenizer, plan: Plan, objective, val: Sequence, pad_id: int, final: Path, device: torch.device,
    bf16: bool = False,
) -> dict | None:  # fmt: skip
    """Measure, choose and write the adapter's scale (report.json's `adapter_scale`); None when the setting is off."""
    setting = plan.run.adapter_scale
    if setting == "off":
        return None
    started = time.perf_counter()
    if plan.method != "lora":
        return _record(Choice(1.0, FULL_RUN), [], started)
    if setting == AUTO and plan.objective == "dpo":
        return _record(Choice(1.0, PREFERENCE_RUN), [], started)
    if setting == AUTO and not len(val):
        return _record(Choice(1.0, NO_VALIDATION), [], started)
    alphas = GRID if setting == AUTO else tuple(sorted({float(setting), 1.0}))
    general, probe_note = _general_probe(plan, tokenizer) if plan.objective == "sft" else ([], "")
    measure = lambda records: _mean_loss(model, objective, records, plan, pad_id, device, bf16)  # noqa: E731
    measured = []
    for alpha in (REFERENCE, *alphas):
        with scaled(model, alpha):
            measured.append(
                {"alpha": alpha, "val_loss": measure(val) if len(val) else None,
                 "general_loss": measure(general) if general else None}
            )  # fmt: skip
    if setting == AUTO:
        choice = choose_scale(measured)
    else:
        choice = Choice(float(setting), "set for this run (not chosen by Auto)")
    if choice.value != 1.0:
        write_scaled(model, final, choice.value)
    record = _record(choice, measured, started, probe_note)
    record["general_probe"] = {"records": len(general), "source": GENERAL_PROBE}
    full_val_loss = measured[-1]["val_loss"]  # scale 1 is measured last
    if setting == AUTO and full_val_loss is not None:
        record["tolerance"] = tolerance(full_val_loss)
    log.info("adapter scale %g: %s", choice.value, record["reason"])
    return record


def _record(choice: Choice[float], measured: list[dict], started: float, note: str = "") -> dict:
    reason = choice.reason + (f" ({note})" if note else "")
    return {"value": choice.value, "reason": reason, "measured": measured, "seconds": time.perf_counter() - started}


# ---------------------------------------------------------------------------- measuring


def _general_probe(plan: Plan, tokenizer) -> tuple[list, str]:
    """The held-out general prompts with the base's own answers, tokenized as the run tokenizes (its template, its
    limit); an empty list and why when the base finished none of its answers."""
    try:
        rows = base_answers(plan.run, tokenizer, held_out=True)
    except UserError as exc:
        return [], f"no general probe: {exc}"
    chat = ChatTokenizer(tokenizer)
    records = []
    for index, row in enumerate(rows):
        messages = tuple(Message(m["role"], m["content"]) for m in row["messages"])
        record = Record(messages, (len(messages) - 1,), index, index + 1)
        outcome = chat.tokenize(record, plan.max_seq_len, "left")
        if outcome.record is not None:
            records.append(outcome.record)
    return records, ""


@torch.no_grad()
def _mean_loss(model, objective, records: Sequence, plan: Plan, pad_id: int, device, bf16: bool) -> float | None:
    """sum(loss_sum) / sum(normaliser) over `records`, in the groups the loop's evaluation uses: val_loss's number."""
    was_training = model.training
    model.eval()
    per_group = max(1, plan.effective_batch // (plan.devices * plan.grad_accum))
    ordered = sorted((records[i] for i in range(len(records))), key=len)
    total = torch.zeros((), dtype=torch.float64)
    normaliser = 0.0
    for start in range(0, len(ordered), per_group):
        group = ordered[start : start + per_group]
        batch = objective.batch(group, plan, pad_id).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss_sum, _ = objective.loss(model, batch)
        total += loss_sum.detach().double().cpu()
        normaliser += objective.normaliser(group)
    model.train(was_training)
    return float(total) / normaliser if normaliser > 0 else None


@contextlib.contextmanager
def scaled(model, alpha: float) -> Iterator[None]:
    """The model as base + alpha x update while inside: every LoRA layer's scaling x alpha, and an output layer
    trained in full moved to base + alpha x (trained - base). Everything is put back on leaving."""
    from peft.tuners.lora import LoraLayer  # peft: a LoRA run's model already loaded it
    from peft.utils import ModulesToSaveWrapper  # peft: as above

    scalings = [(m, dict(m.scaling)) for m in model.modules() if isinstance(m, LoraLayer)]
    trained = []
    with torch.no_grad():
        for layer, before in scalings:
            layer.scaling.update({name: value * alpha for name, value in before.items()})
        for wrapper in (m for m in model.modules() if isinstance(m, ModulesToSaveWrapper)):
            for copy in wrapper.modules_to_save.values():
                for name, param in copy.named_parameters():
                    base = wrapper.original_module.get_parameter(name)
                    trained.append((param, param.detach().clone()))
                    param.copy_(base + alpha * (param - base))
    try:
        yield
    finally:
        with torch.no_grad():
            for layer, before in scalings:
                layer.scaling.clear()
                layer.scaling.update(before)
            for param, value in trained:
                param.copy_(value)


# ---------------------------------------------------------------------------- writing


def write_scaled(model, final: Path, alpha: float) -> None:
    """Rewrite FINAL's adapter_config.json (lora_alpha x alpha) and adapter_model.safetensors (a trained output
    layer at base + alpha x (trained - base); the LoRA matrices as they are), each file replaced whole."""
    configs = model.peft_config.values()
    before = [(config, config.lora_alpha, dict(config.alpha_pattern or {})) for config in configs]
    tmp = Path(tempfile.mkdtemp(prefix=".scaled-", dir=final))
    try:
        for config, lora_alpha, pattern in before:
            config.lora_alpha = lora_alpha * alpha
            config.alpha_pattern = {key: value * alpha for key, value in pattern.items()}
        with scaled(model, alpha):  # the output layer as it will be saved; the LoRA matrices do not change
            model.save_pretrained(tmp)
        for name in ADAPTER_FILES:
            os.replace(tmp / name, final / name)
    finally:
        for config, lora_alpha, pattern in before:
            config.lora_alpha, config.alpha_pattern = lora_alpha, pattern
        shutil.rmtree(tmp, ignore_errors=True)
