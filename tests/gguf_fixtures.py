"""Tiny models for the GGUF and chat-template tests, built offline in a second or two.

    plain_base(out, "qwen2")                 # a base model folder with no chat template and no ChatML tokens
    write_gguf(model_dir, "model.gguf")      # that folder (or the toy model) as a GGUF file, all tensors F32

The GGUF writer is a test fixture, not an exporter: F32 tensors only, the tensor names and metadata llama.cpp's
converter writes for Llama and Qwen2 (Llama's q/k rows permuted the way llama.cpp stores them, which
transformers' reader undoes), and the tokenizer as a GPT-2-style BPE.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CORPUS = [
    "Hello! Thanks for reaching out. I can help you with your account, your order, billing and shipping.",
    "Could you tell me your order number? The package left our warehouse yesterday and should arrive soon.",
    "To reset your password, open Settings, choose Security and follow the link we send to your email.",
    "We are sorry for the trouble. A refund usually takes three to five business days to appear.",
    "The quick brown fox jumps over the lazy dog. 0123456789 user assistant system",
]
END_OF_TEXT = "<|endoftext|>"


def plain_base(out: Path, architecture: str = "llama", vocab: int = 400, seed: int = 0) -> Path:
    """A random tiny causal LM whose tokenizer has no chat template and no ChatML tokens (like a base GGUF)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[END_OF_TEXT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=END_OF_TEXT, pad_token=END_OF_TEXT)
    dims = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=architecture == "qwen2",  # one of each: tied (Qwen2) and untied (Llama)
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**dims)) if architecture == "qwen2" else LlamaForCausalLM(LlamaConfig(**dims))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's row order for Llama's q/k projections (convert_hf_to_gguf.py LlamaModel.permute)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


TENSOR_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(
    model_dir: Path,
    path: Path,
    chat_template: bool = True,
    architecture: str | None = None,
    float64: tuple[str, ...] = (),
) -> Path:
    """Write a transformers Llama/Qwen2 folder as a GGUF file (F32). `architecture` overrides the name written,
    and the tensors named in `float64` are stored as F64 (both make files transformers cannot read)."""
    import gguf
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    config = json.loads((model_dir / "config.json").read_text())
    arch = config["model_type"]
    tensors = load_file(model_dir / "model.safetensors")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    writer = gguf.GGUFWriter(str(path), architecture or arch)
    writer.add_name(f"finetune test {arch}")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    writer.add_rope_freq_base(float((config.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    writer.add_vocab_size(config["vocab_size"])

    # ---- tokenizer: GPT-2 style BPE (vocabulary in id order, merges, special tokens as control tokens)
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = backend["model"]["vocab"] | {t["content"]: t["id"] for t in backend["added_tokens"]}
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {t["content"] for t in backend["added_tokens"] if t.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    if chat_template and tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)

    # ---- tensors, in llama.cpp's names
    for name, value in tensors.items():
        value = value.astype(np.float32)
        if name == "model.embed_tokens.weight":
            target = "token_embd.weight"
        elif name == "model.norm.weight":
            target = "output_norm.weight"
        elif name == "lm_head.weight":
            target = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            target = f"blk.{layer}.{TENSOR_NAMES[rest]}"
            if arch == "llama" and rest == "self_attn.q_proj.weight":
                value = _llama_permute(value, heads)
            elif arch == "llama" and rest == "self_attn.k_proj.weight":
                value = _llama_permute(value, kv_heads)
        writer.add_tensor(target, value.astype(np.float64) if target in float64 else value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
