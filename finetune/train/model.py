"""Load a causal LM (any transformers model, hub id or local folder) and, for LoRA, wrap it with PEFT."""

from __future__ import annotations

import warnings

import torch

from finetune.models.source import check_remote_code, load_failure, local_model
from finetune.settings.errors import UserError
from finetune.settings.wording import ref


def attention_for(device: torch.device) -> str | None:
    """FlashAttention 2 on a GPU where flash-attn is installed (its varlen kernel runs packed records with no
    filler); None leaves transformers' own choice (SDPA), which attention.py switches to its varlen loop."""
    from transformers.utils import is_flash_attn_2_available

    return "flash_attention_2" if device.type == "cuda" and is_flash_attn_2_available() else None


# The rows load_model added to the embeddings (new special tokens, e.g. ChatML's): add_lora trains them.
NEW_TOKEN_ROWS = "finetune_new_token_rows"


def load_model(
    name: str,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    attention: str | None = None,
    vocab_size: int | None = None,
):
    """AutoModelForCausalLM from safetensors only (never a pickle). A GGUF file or a pulled base's name loads
    from its converted folder. `vocab_size` (the tokenizer's length): grow the embeddings to it when the
    tokenizer has tokens the model lacks (ChatML added to a base model without a chat template)."""
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
            old = layer.weight[:rows].float()
            noise = torch.randn(vocab_size - rows, old.shape[1], generator=generator) * old.std(0) * 0.01
            layer.weight[rows:] = (old.mean(0) + noise).to(layer.weight.dtype)
            if getattr(layer, "bias", None) is not None:
                layer.bias[rows:] = layer.bias[:rows].mean()
    setattr(model, NEW_TOKEN_ROWS, list(range(rows, vocab_size)))


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
        trainable_token_indices=_new_token_rows(model, train_head),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def _new_token_rows(model, train_head: bool) -> dict[str, list[int]] | None:
    """The rows load_model added (new special tokens): trained beside the adapter, in the embeddings and in an
    untied output layer (a tied one follows the embeddings), as TRL does after adding a chat format's tokens."""
    rows = getattr(model, NEW_TOKEN_ROWS, None)
    if not rows:
        return None
    # PEFT then saves the resized embeddings with the adapter (what lets it load back on the base) and says so
    warnings.filterwarnings("ignore", message="Setting `save_embedding_layers` to `True`")
    modules = dict(model.named_modules())
    chosen = {_name_of(modules, model.get_input_embeddings()): rows}
    head = model.get_output_embeddings()
    tied = getattr(model.config, "tie_word_embeddings", False)
    if head is not None and not tied and not train_head:  # a head trained in full already learns the new rows
        chosen[_name_of(modules, head)] = rows
    return chosen


def _name_of(modules: dict, module) -> str:
    return next(name for name, candidate in modules.items() if candidate is module).rsplit(".", 1)[-1]


def output_layer_name(model) -> str:
    """The module name of the model's output layer (LM head), e.g. "lm_head"."""
    head = model.get_output_embeddings()
    if getattr(model.config, "tie_word_embeddings", False) or head is None:
        raise UserError(
            "this model's output layer cannot be trained beside the adapter (it is tied to the input embeddings, "
            f"or there is none): use {ref('lora_train_head', 'off')}"
        )
    return next(name for name, module in model.named_modules() if module is head).rsplit(".", 1)[-1]


def output_layer_weight(head) -> torch.Tensor:
    """The weight `head(hidden)` multiplies by. A head PEFT trains beside an adapter (modules_to_save) answers
    `.weight` with its trained copy even while the adapter is switched off; then the original is the one used."""
    if getattr(head, "disable_adapters", False) and hasattr(head, "original_module"):
        return head.original_module.weight
    return head.weight


def trainable_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def enable_gradient_checkpointing(model) -> None:
    # non-reentrant checkpointing needs no input-requires-grad hooks, which matters for a frozen base
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def model_for(plan, device: torch.device, vocab_size: int | None = None):
    """The model a plan trains: loaded in fp32 (the embeddings grown to `vocab_size`, the tokenizer's length,
    when the chat template added tokens), attention for packed rows, the LoRA adapter, checkpointing."""
    # transformers: attention.py imports it to register its kernel; this module loads it only when a model loads
    from finetune.train.attention import use_varlen_attention

    model = load_model(plan.run.model, torch.float32, plan.run.trust_remote_code, attention_for(device), vocab_size)
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
