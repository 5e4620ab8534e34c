"""A model's shape and size as plain numbers (ModelFacts), and the arithmetic on them: the parameters of a
Llama-like layout from its dimensions, a LoRA's parameters, the facts of a parsed config.json.

Reading them from a model's files (safetensors headers, config.json, a GGUF header, a pulled base) is
models/facts.py; the memory estimate (memory.py) and the plan use them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from finetune.settings.errors import UserError

# Families whose layout the config formula knows exactly (decoder blocks of attention + gated MLP, RMSNorm).
KNOWN_LAYOUTS = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelFacts:
    """Shape and size of a causal LM, as plain numbers."""

    name: str
    """What the user passed as --model."""
    source: str
    """Where the numbers come from: safetensors headers, config.json, or the built-in table."""
    model_type: str | None
    """config.json `model_type` (llama, qwen2, ...)."""
    total_params: int
    """Every parameter of the model (tied embeddings counted once)."""
    exact: bool
    """True when the count is read from the weights or computed for a known layout; False when guessed."""
    hidden_size: int
    """Width of the residual stream."""
    num_layers: int
    """Decoder blocks."""
    num_heads: int
    """Attention (query) heads."""
    num_kv_heads: int
    """Key/value heads (fewer than query heads with grouped-query attention)."""
    head_dim: int
    """Width of one attention head."""
    intermediate_size: int
    """Width of the gated MLP."""
    vocab_size: int
    """Rows of the embedding (and of the output layer)."""
    tie_word_embeddings: bool
    """True when the output layer shares the embedding's weights."""
    attention_bias: bool = False
    """Biases on the q/k/v projections (Qwen2 has them)."""
    context_length: int | None = None
    """Longest sequence the model was trained for (max_position_embeddings, a GGUF's context_length)."""

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of every linear layer of one decoder block: q, k, v, o, gate, up, down."""
        h, i = self.hidden_size, self.intermediate_size
        return [(h, self.q_dim), (h, self.kv_dim), (h, self.kv_dim), (self.q_dim, h), (h, i), (h, i), (i, h)]

    @property
    def head_params(self) -> int:
        """Weights of the output layer (LM head): vocabulary x hidden size."""
        return self.vocab_size * self.hidden_size

    def lora_params(self, rank: int) -> int:
        """Trainable parameters of a rank-r LoRA on every linear layer of the blocks (not the output layer)."""
        return self.num_layers * sum(rank * (n_in + n_out) for n_in, n_out in self.linear_shapes())


def params_from_dims(facts: ModelFacts) -> int:
    """Parameter count of a Llama/Mistral/Qwen2/Qwen3-like model from its dimensions."""
    h, v = facts.hidden_size, facts.vocab_size
    block = sum(n_in * n_out for n_in, n_out in facts.linear_shapes())
    block += 2 * h  # input and post-attention RMSNorm
    if facts.attention_bias:
        block += facts.q_dim + 2 * facts.kv_dim  # q, k, v biases
        if facts.model_type != "qwen2":
            block += h  # Llama's attention_bias also puts a bias on o_proj
    if facts.model_type == "qwen3":
        block += 2 * facts.head_dim  # per-head q_norm and k_norm
    embeddings = v * h * (1 if facts.tie_word_embeddings else 2)
    return embeddings + facts.num_layers * block + h  # + final norm


def _dims(name: str, source: str, cfg: dict) -> ModelFacts:
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    try:
        hidden, layers, heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
        intermediate, vocab = int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{source}: not a decoder config this planner understands (missing or bad {exc})") from None
    model_type = cfg.get("model_type")
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    facts = ModelFacts(
        name=name,
        source=source,
        model_type=model_type,
        total_params=0,
        exact=model_type in KNOWN_LAYOUTS,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        context_length=positive_whole(cfg.get("max_position_embeddings")),
    )
    return replace(facts, total_params=params_from_dims(facts))


def positive_whole(value: object) -> int | None:
    """A whole number above 0 as it is; None for anything else (a missing or odd value in a config)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def from_config(cfg: dict, name: str, source: str) -> ModelFacts:
    """ModelFacts from a parsed config.json (count computed from the dimensions)."""
    facts = _dims(name, source, cfg)
    if not facts.exact:
        facts = replace(facts, source=f"{source} (parameters computed assuming a Llama-like layout)")
    return facts
