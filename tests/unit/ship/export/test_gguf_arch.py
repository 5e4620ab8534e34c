"""GGUF architecture families: which configs are written, which are refused (and how), the q/k permutation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune.settings.errors import UserError
from finetune.ship.export.gguf_arch import (
    FAMILIES,
    LLAMA,
    QWEN2,
    QWEN3,
    family_of,
    is_rotary_projection,
    rotary_permuted,
)

LLAMA_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def test_supported_model_types_map_to_llama_cpp_architectures():
    assert family_of(LLAMA_CONFIG, "x") is LLAMA
    assert family_of({**LLAMA_CONFIG, "model_type": "mistral"}, "x") is LLAMA  # llama.cpp converts Mistral so too
    assert family_of({**LLAMA_CONFIG, "model_type": "qwen2"}, "x") is QWEN2
    assert family_of({**LLAMA_CONFIG, "model_type": "qwen3"}, "x") is QWEN3
    assert {f.arch for f in FAMILIES.values()} == {"llama", "qwen2", "qwen3"}
    # an older config (rope_theta at the top, rope_scaling null) is the same model
    older = {k: v for k, v in LLAMA_CONFIG.items() if k != "rope_parameters"}
    assert family_of({**older, "rope_theta": 1e5, "rope_scaling": None}, "x") is LLAMA


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "gpt2 (GPT2LMHeadModel)"),
        ({"model_type": None, "architectures": None}, "not stated"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}}, "rope type = 'llama3'"),
        ({"attention_bias": True}, "attention_bias = True"),
        ({"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
    ],
)
def test_what_is_not_supported_is_one_sentence_naming_it(change, named):
    with pytest.raises(UserError) as caught:
        family_of({**LLAMA_CONFIG, **change}, "runs/one")
    message = str(caught.value)
    assert named in message and "runs/one" in message and "\n" not in message
    assert "docs/gguf.md" in message
    if "architecture" in message:
        assert "Qwen2 and Qwen3" in message  # says what is supported


def test_qwen2_with_sliding_window_is_refused():
    with pytest.raises(UserError, match="use_sliding_window = True"):
        family_of({**LLAMA_CONFIG, "model_type": "qwen2", "use_sliding_window": True}, "x")


def _transformers_unpermute(weights: np.ndarray, n_head: int, num_kv_heads: int) -> np.ndarray:
    """transformers' GGUF reader (LlamaTensorProcessor), the independent reader our file must satisfy."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    processor = LlamaTensorProcessor(config={"num_attention_heads": n_head, "num_key_value_heads": num_kv_heads})
    return processor._reverse_permute_weights(weights, n_head, num_kv_heads)


@pytest.mark.parametrize("which", ["q", "k"])
@pytest.mark.parametrize("shape", [(64, 64), (64,)])  # a weight and a bias
def test_rotary_permutation_is_exactly_what_the_reader_undoes(which, shape):
    config = {**LLAMA_CONFIG}
    rows = 64 if which == "q" else 32  # 4 heads x 16, or 2 kv heads x 16
    tensor = torch.randn(rows, *shape[1:])
    permuted = rotary_permuted(tensor, config, which)
    assert not torch.equal(permuted, tensor)  # it does reorder
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"] if which == "k" else heads
    restored = _transformers_unpermute(permuted.numpy(), heads, kv_heads)
    assert np.array_equal(restored, tensor.numpy())


def test_rotary_permutation_pairs_the_two_halves_of_each_head():
    # one head of 4 dims: transformers rotates (x0, x2) and (x1, x3); llama.cpp adjacent pairs
    tensor = torch.arange(4.0).reshape(4, 1)
    permuted = rotary_permuted(tensor, {"num_attention_heads": 1, "num_key_value_heads": 1}, "q")
    assert permuted.flatten().tolist() == [0.0, 2.0, 1.0, 3.0]


def test_only_q_and_k_projections_are_permuted():
    assert is_rotary_projection("model.layers.3.self_attn.q_proj.weight") == "q"
    assert is_rotary_projection("model.layers.3.self_attn.k_proj.bias") == "k"
    assert is_rotary_projection("model.layers.3.self_attn.v_proj.weight") is None
    assert is_rotary_projection("model.layers.3.self_attn.o_proj.weight") is None
