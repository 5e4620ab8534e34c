"""The transformers model inside the wrappers training puts around it (PEFT, DDP, FSDP's root)."""

from __future__ import annotations


def causal_lm(model):
    """The transformers CausalLM inside a (possibly PEFT- or FSDP-wrapped) model."""
    while hasattr(model, "module"):  # wrappers that keep the model as .module
        model = model.module
    if hasattr(model, "get_base_model"):  # PEFT: LoRA layers are injected into this model
        model = model.get_base_model()
    return model
