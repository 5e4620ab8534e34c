"""The architecture families GGUF export knows: which llama.cpp architecture, its metadata, its tensor layout.

    family = family_of(config, "runs/one")     # refuses, in one sentence, what is not supported (no weights read)
    write_hyperparameters(writer, config, family)
    gguf_name = family.tensor_name(hf_name, layers)
    tensor = rotary_permuted(tensor, config) if family.rotary_permute and is_q_or_k(hf_name) else tensor

Each family mirrors what llama.cpp's own converter writes for it (conversion/llama.py, conversion/qwen.py:
the same keys, the same tensor names through gguf's map, the same q/k permutation for Llama). To add a
family, see docs/gguf.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from finetune.settings.errors import UserError


@dataclass(frozen=True)
class Family:
    name: str  # as messages and the docs say it
    arch: str  # llama.cpp's architecture name (general.architecture)
    # llama.cpp's Llama graph rotates adjacent pairs of a head's dimensions, transformers rotates its two halves:
    # the q and k rows are permuted so both compute the same attention (llama.cpp: LlamaModel.permute)
    rotary_permute: bool
    # config settings this family's llama.cpp graph has no place for: (key, value that is fine)
    must_be: tuple[tuple[str, object], ...] = ()

    def tensor_name(self, hf_name: str, layers: int) -> str | None:
        """The GGUF name of a transformers tensor (`model.layers.0.self_attn.q_proj.weight` -> `blk.0.attn_q.weight`)."""
        return _name_map(self.arch, layers).get_name(hf_name, try_suffixes=(".weight", ".bias"))


@functools.lru_cache(maxsize=8)
def _name_map(arch_name: str, layers: int):
    """gguf's tensor-name map for one architecture and depth (built once: it lists every name of every layer)."""
    import gguf

    arch = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == arch_name)
    return gguf.get_tensor_name_map(arch, layers)


LLAMA = Family("Llama", "llama", rotary_permute=True, must_be=(("attention_bias", False), ("mlp_bias", False)))
QWEN2 = Family("Qwen2", "qwen2", rotary_permute=False, must_be=(("use_sliding_window", False),))
QWEN3 = Family("Qwen3", "qwen3", rotary_permute=False, must_be=(("attention_bias", False),))

# config.json model_type -> family; Mistral's dense models are the Llama graph (llama.cpp converts them so too)
FAMILIES = {"llama": LLAMA, "mistral": LLAMA, "qwen2": QWEN2, "qwen3": QWEN3}
SUPPORTED = "Llama-family models (model_type llama or mistral: SmolLM2, Llama, Mistral), Qwen2 and Qwen3"


def rope_settings(config: dict) -> dict:
    """The rotary settings however the config spells them (transformers 5: rope_parameters; older: rope_theta)."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if "rope_theta" not in rope and "rope_theta" in config:
        rope["rope_theta"] = config["rope_theta"]
    rope.setdefault("rope_type", rope.get("type") or "default")
    return rope


def family_of(config: dict, where: str) -> Family:
    """The family of a model's config.json, or a UserError naming what is not supported and what is."""
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type)
    if family is None:
        shown = ", ".join(config.get("architectures") or []) or "no architectures listed"
        raise UserError(
            f"GGUF export does not support {where}: its architecture is {model_type or 'not stated'} ({shown}); "
            f"supported so far: {SUPPORTED} (docs/gguf.md says how to add one)"
        )
    settings = [(key, config.get(key, fine), fine) for key, fine in family.must_be]
    settings.append(("hidden_act", config.get("hidden_act", "silu"), "silu"))
    settings.append(("rope type", rope_settings(config)["rope_type"], "default"))
    for key, value, fine in settings:
        if value not in (fine, None):
            raise UserError(
                f"GGUF export does not support {where} yet: it is a {family.name} model with {key} = {value!r}, and "
                f"only {key} = {fine!r} is written and checked so far (docs/gguf.md says how to add a variant)"
            )
    return family


def head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def write_hyperparameters(writer, config: dict, family: Family) -> None:
    """The `{arch}.*` keys llama.cpp reads for this family (llama.cpp: TextModel/LlamaModel.set_gguf_parameters)."""
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads") or config["num_attention_heads"])
    writer.add_rope_freq_base(float(rope_settings(config).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if family is LLAMA:
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim(config))


def is_rotary_projection(hf_name: str) -> str | None:
    """Which projection (q or k) the rotary permutation reorders the rows of; None for every other tensor."""
    for which in ("q", "k"):
        if hf_name.endswith((f".{which}_proj.weight", f".{which}_proj.bias")):
            return which
    return None


def rotary_permuted(tensor, config: dict, which: str):
    """llama.cpp's q/k row order for one projection (weight or bias); transformers' GGUF reader undoes exactly this."""
    heads = config["num_attention_heads"]
    if which == "k":
        heads = config.get("num_key_value_heads") or heads
    rows = tensor.shape[0]
    # per head: rows [x0 .. x(d/2-1) | y0 .. y(d/2-1)] -> [x0 y0 x1 y1 ...]
    return tensor.reshape(heads, 2, rows // heads // 2, *tensor.shape[1:]).swapaxes(1, 2).reshape(tensor.shape)
