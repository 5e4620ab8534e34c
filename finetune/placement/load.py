"""Load a causal LM (any transformers model: a hub id, a local folder, a GGUF file or a pulled base's name) in a
run's precision, on its device; with a LoRA adapter on top.

    model = load_placed(name, placement)                          # generation and scoring: the run's precision
    model = load_placed(name, placement, method="full")           # full fine-tuning: fp32 master weights
    model = load_adapted(base, adapter_folder, placement, vocab)  # a LoRA run's final weights, ready to generate

Safetensors only (never a pickle); `trust_remote_code` only when asked (models/source.py checks it).
"""

from __future__ import annotations

import torch

from finetune.models.source import check_remote_code, load_failure, local_model
from finetune.placement.where import Placement

# The rows load_model added to the embeddings (new special tokens, e.g. ChatML's): add_lora trains them.
NEW_TOKEN_ROWS = "finetune_new_token_rows"


def load_model(
    name: str,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    attention: str | None = None,
    vocab_size: int | None = None,
):
    """AutoModelForCausalLM in `dtype`, on the CPU. A GGUF file or a pulled base's name loads from its converted
    folder. `vocab_size` (the tokenizer's length): grow the embeddings to it when the tokenizer has tokens the model
    lacks (ChatML added to a base model without a chat template)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    check_remote_code(name, trust_remote_code)
    hf_logging.disable_progress_bar()
    location = local_model(name)
    load = lambda **chosen: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        location, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code, **chosen
    )
    model = _load(load, name, attention)
    if vocab_size:
        grow_vocabulary(model, vocab_size)
    return model


def load_placed(
    name: str,
    placement: Placement,
    method: str | None = None,
    trust_remote_code: bool = False,
    vocab_size: int | None = None,
    attention: str | None = None,
):
    """`name` in the placement's precision (full fine-tuning: fp32 master weights), on its device."""
    model = load_model(name, placement.weights_dtype(method), trust_remote_code, attention, vocab_size)
    return place(model, placement)


def load_adapted(base: str, adapter: str, placement: Placement, vocab_size: int | None = None,
                 trust_remote_code: bool = False):  # fmt: skip
    """A LoRA adapter folder on its base, placed, in eval mode: the base grown to the run's tokenizer (`vocab_size`)
    when training added tokens, base and adapter in the placement's precision (generation and scoring only: a bf16
    adapter costs no cast of each layer's input, as an fp32 one on a bf16 base would)."""
    from peft import PeftModel

    base_model = load_placed(base, placement, trust_remote_code=trust_remote_code, vocab_size=vocab_size)
    model = PeftModel.from_pretrained(
        base_model, adapter, autocast_adapter_dtype=False, torch_device=device_of(base_model)
    )
    return place(model, placement).eval()


def device_of(model) -> str:
    """Where a model's weights are: an adapter loaded onto it goes there (PEFT would pick any GPU it can see)."""
    return str(next(model.parameters()).device)


def place(model, placement: Placement):
    """The model on the placement's device (the one call that moves a loaded model: tests watch it)."""
    return model.to(placement.torch_device)


def _load(load, name: str, attention: str | None):
    try:
        if attention:
            try:
                return load(attn_implementation=attention)
            except ValueError:  # this architecture does not support it: transformers' default attention
                pass
        return load()
    except Exception as exc:  # OSError, ValueError, hub errors: all mean "cannot load this model"
        raise load_failure(f"the model {name!r}", exc) from None  # issue 26: names --trust-remote-code


def grow_vocabulary(model, vocab_size: int) -> None:
    """Resize the embeddings (and an untied output layer) to `vocab_size` rows when they have fewer.

    The new rows start at the mean of the existing ones plus a little seeded noise (so two new tokens can be
    told apart), the same on every load; a LoRA run trains them (add_lora) and saves them with the adapter.
    """
    embeddings = model.get_input_embeddings()
    rows = embeddings.weight.shape[0]
    if vocab_size <= rows:
        return
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    generator = torch.Generator().manual_seed(0)
    layers = [model.get_input_embeddings(), model.get_output_embeddings()]
    with torch.no_grad():
        for layer in {id(layer.weight): layer for layer in layers if layer is not None}.values():
            old = layer.weight[:rows].float().cpu()
            noise = torch.randn(vocab_size - rows, old.shape[1], generator=generator) * old.std(0) * 0.01
            layer.weight[rows:] = (old.mean(0) + noise).to(layer.weight.dtype)
            if getattr(layer, "bias", None) is not None:
                layer.bias[rows:] = layer.bias[:rows].mean()
    setattr(model, NEW_TOKEN_ROWS, list(range(rows, vocab_size)))
