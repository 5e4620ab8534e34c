"""Load a causal LM (any transformers model, hub id or local folder) and, for LoRA, wrap it with PEFT."""

from __future__ import annotations

import torch

from finetune.errors import UserError
from finetune.model_source import load_failure


def attention_for(device: torch.device) -> str | None:
    """FlashAttention 2 on a GPU where flash-attn is installed (its varlen kernel runs packed records with no
    filler); None leaves transformers' own choice (SDPA), which attention.py switches to its varlen loop."""
    from transformers.utils import is_flash_attn_2_available

    return "flash_attention_2" if device.type == "cuda" and is_flash_attn_2_available() else None


def load_model(
    name: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False, attention: str | None = None
):
    """AutoModelForCausalLM from safetensors only (never a pickle)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    load = lambda **chosen: AutoModelForCausalLM.from_pretrained(  # noqa: E731
        name, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code, **chosen
    )
    try:
        if attention:
            try:
                return load(attn_implementation=attention)
            except ValueError:  # this architecture does not support it: transformers' default attention
                pass
        return load()
    except Exception as exc:  # OSError, ValueError, hub errors: all mean "cannot load this model"
        raise load_failure(f"the model {name!r}", exc) from None  # issue 26: names --trust-remote-code


def add_lora(model, rank: int, alpha: float, dropout: float, seed: int, train_head: bool = False):
    """Wrap with a LoRA adapter on every linear layer of the blocks; the base weights are frozen. With
    `train_head`, the output layer is trained in full beside it (saved with the adapter, merged on export)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)  # LoRA A matrices are initialised randomly: make them reproducible
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules="all-linear",
        modules_to_save=[output_layer_name(model)] if train_head else None,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def output_layer_name(model) -> str:
    """The module name of the model's output layer (LM head), e.g. "lm_head"."""
    head = model.get_output_embeddings()
    if getattr(model.config, "tie_word_embeddings", False) or head is None:
        raise UserError(
            "this model's output layer cannot be trained beside the adapter (it is tied to the input embeddings, "
            "or there is none): use --lora-train-head off"
        )
    return next(name for name, module in model.named_modules() if module is head).rsplit(".", 1)[-1]


def output_layer_weight(head) -> torch.Tensor:
    """The weight `head(hidden)` multiplies by. A head PEFT trains beside an adapter (modules_to_save) answers
    `.weight` with its trained copy even while the adapter is switched off; then the original is the one used."""
    if getattr(head, "disable_adapters", False) and hasattr(head, "original_module"):
        return head.original_module.weight
    return head.weight


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


def model_for(plan, device: torch.device):
    """The model a plan trains: loaded in fp32, attention for packed rows, the LoRA adapter, checkpointing."""
    from finetune.train.attention import use_varlen_attention

    model = load_model(plan.run.model, torch.float32, plan.run.trust_remote_code, attention_for(device))
    if plan.packing:
        use_varlen_attention(model)  # packed records run as one row, attention record by record: no filler, no mask
    if plan.method == "lora":
        model = add_lora(
            model, plan.lora_rank, plan.lora_alpha, plan.lora_dropout, plan.seed, bool(plan.lora_train_head)
        )
    if plan.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    torch.manual_seed(plan.seed)  # dropout and anything random in the loop start from the seed
    return model
