"""The model a run trains: loaded through the placement layer (placement/) in the run's precision, and for LoRA
wrapped with PEFT, its trained weights in fp32."""

from __future__ import annotations

import warnings

import torch

from finetune.placement.load import NEW_TOKEN_ROWS, grow_vocabulary, load_model, load_placed  # noqa: F401 (their home)
from finetune.placement.where import Placement, of_plan
from finetune.settings.errors import UserError
from finetune.settings.wording import ref


def attention_for(device: torch.device) -> str | None:
    """FlashAttention 2 on a GPU where flash-attn is installed (its varlen kernel runs packed records with no
    filler); None leaves transformers' own choice (SDPA), which attention.py switches to its varlen loop."""
    from transformers.utils import is_flash_attn_2_available

    return "flash_attention_2" if device.type == "cuda" and is_flash_attn_2_available() else None


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


def model_for(plan, device: torch.device, vocab_size: int | None = None, placement: Placement | None = None):
    """The model a plan trains, on `device` in the plan's precision (placement/where.py): a LoRA run's frozen base in
    it (bf16: half the bytes), a full run's weights in fp32 (master weights; its passes run under autocast); the
    embeddings grown to `vocab_size`, the tokenizer's length, when the chat template added tokens; attention for
    packed rows; the LoRA adapter, everything trained in fp32; checkpointing."""
    # transformers: attention.py imports it to register its kernel; this module loads it only when a model loads
    from finetune.train.attention import use_varlen_attention

    placement = placement or of_plan(plan, device)
    dtype = placement.weights_dtype(plan.method)
    model = load_model(plan.run.model, dtype, plan.run.trust_remote_code, attention_for(device), vocab_size)
    if plan.packing:
        use_varlen_attention(model)  # packed records run as one row, attention record by record: no filler, no mask
    if plan.method == "lora":
        model = add_lora(
            model, plan.lora_rank, plan.lora_alpha, plan.lora_dropout, plan.seed, bool(plan.lora_train_head)
        )
        trained_in_fp32(model, autocast=placement.autocast)
    if plan.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    torch.manual_seed(plan.seed)  # dropout and anything random in the loop start from the seed
    return model


def trained_in_fp32(model, autocast: bool = False) -> None:
    """Every trained weight in fp32 (the adapter, a head trained beside it, new token rows), whatever the frozen base
    is held in: AdamW's moments follow their weights' precision, and updates far smaller than a bf16 step stay.
    Under bf16 autocast the adapter's products run in bf16 too: PEFT's cast of each layer's input up to the adapter's
    fp32 is switched off (on SmolLM2 those casts took a sixth of a step's CPU time)."""
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
    if autocast:
        for module in model.modules():
            if hasattr(module, "cast_input_dtype_enabled"):
                module.cast_input_dtype_enabled = False
