"""Load a causal LM (any transformers model, hub id or local folder) and, for LoRA, wrap it with PEFT."""

from __future__ import annotations

import torch

from finetune.errors import UserError


def load_model(name: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False):
    """AutoModelForCausalLM from safetensors only (never a pickle)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        return AutoModelForCausalLM.from_pretrained(
            name, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # OSError, ValueError, hub errors: all mean "cannot load this model"
        raise UserError(f"cannot load the model {name!r}: {exc}") from None


def add_lora(model, rank: int, alpha: float, dropout: float, seed: int):
    """Wrap with a LoRA adapter on every linear layer of the blocks; the base weights are frozen."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)  # LoRA A matrices are initialised randomly: make them reproducible
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    return get_peft_model(model, config)


def causal_lm(model):
    """The transformers CausalLM inside a (possibly PEFT- or FSDP-wrapped) model."""
    while hasattr(model, "module"):  # wrappers that keep the model as .module
        model = model.module
    if hasattr(model, "get_base_model"):  # PEFT: LoRA layers are injected into this model
        model = model.get_base_model()
    return model


def trainable_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def enable_gradient_checkpointing(model) -> None:
    # non-reentrant checkpointing needs no input-requires-grad hooks, which matters for a frozen base
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
