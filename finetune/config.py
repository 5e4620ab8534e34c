"""RunConfig: every knob of a run, with "auto" as a legal value where Auto can choose.

One object is shared by `finetune plan`, `finetune train`, the library (`finetune.train(config)`)
and the job service. It is validated once, in `__post_init__`; errors name the flag.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from finetune.errors import UserError

AUTO = "auto"


class ConfigError(UserError, ValueError):
    """A knob has a value that cannot work; the message names the flag."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass
class RunConfig:
    # ---- data
    data: str | None = None
    """Training file (chat JSONL or prompt/completion JSONL)."""
    val_file: str | None = None
    """Use this file as the validation set instead of cutting one from `data`."""
    val_fraction: float | str = AUTO
    """Share of conversations held out for validation; 0 disables validation; auto picks from the data size."""
    record_policy: Literal["all", "last", "each"] = "all"
    """How a conversation becomes records: all targets in one record, only the last, or one record per target."""
    max_seq_len: int = 1024
    """Longest record in tokens; longer ones are handled by `truncation`."""
    truncation: Literal["left", "drop"] = "left"
    """Over-long records: drop context from the left (never a target), or drop the record."""
    cache: bool = True
    """Keep the tokenized data in the token cache and reuse it (off: --no-cache tokenizes every time)."""
    cache_dir: str | None = None
    """Token cache folder (default $FINETUNE_CACHE_DIR, else ~/.cache/finetune/tokens); safe to delete."""

    # ---- model
    model: str | None = None
    """Hub id or local folder of a causal LM (safetensors)."""
    method: Literal["lora", "full"] = "lora"
    """Train a LoRA adapter or every weight of the model."""
    lora_rank: int | str = AUTO
    """LoRA rank r; auto scales it with the data size."""
    lora_alpha: float | str = AUTO
    """LoRA alpha; auto = 2 x rank."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA path."""
    trust_remote_code: bool = False
    """Run code shipped with the model folder (off unless you trust it)."""

    # ---- schedule and batch
    epochs: int | str = AUTO
    """Passes over the training records."""
    batch_size: int | str = AUTO
    """Records per micro-batch on each device."""
    grad_accum: int = 1
    """Micro-batches accumulated into one optimizer step."""
    devices: int = 1
    """Processes (GPUs, or CPU processes with gloo) that train together."""
    lr: float | str = AUTO
    """Peak learning rate; auto by method, effective batch and model width."""
    warmup_ratio: float | None = None
    """Share of total steps used for linear warmup (default 0.05 when no warmup steps are given)."""
    warmup_steps: int | None = None
    """Warmup in steps; overrides warmup_ratio."""
    last_batch: Literal["keep", "drop"] = "keep"
    """Keep or drop the last partial batch of each epoch."""
    schedule: Literal["linear", "cosine"] = "cosine"
    """Decay after warmup, to zero at the last step."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (never applied to biases and norms)."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value; None disables clipping."""
    seed: int = 0
    """Seed for the split, the shuffling, LoRA init and dropout."""

    # ---- run
    out: str | None = None
    """Output folder of the run."""
    eval_every: int | str = AUTO
    """Validation every N optimizer steps (and at each epoch end); auto = about 10 evaluations per run."""
    save_every: int | str = AUTO
    """Checkpoint every N optimizer steps (and at the end); auto = at each evaluation."""
    keep_checkpoints: int = 2
    """Keep the last K checkpoints, plus the best by validation loss."""
    resume: bool = False
    """Continue from the latest checkpoint in `out`."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (the plan is cut to it)."""
    gradient_checkpointing: bool | str = AUTO
    """Recompute activations in the backward pass to save memory; auto from the memory estimate."""
    dtype: Literal["auto", "fp32", "bf16"] = AUTO
    """Compute precision: auto = bf16 autocast on GPUs that support it, fp32 on the CPU."""
    shard: Literal["auto", "full", "none"] = AUTO
    """Multi-device: FSDP-shard the model (full) or replicate it (DDP, none); auto from the memory estimate."""
    packing: bool = True
    """Padding-free packing of records into rows."""

    # ---- money
    price_per_million_tokens: float | None = None
    """Price per million training tokens processed, for the cost estimate."""
    gpu_hour_price: float | None = None
    """Price of one device-hour, for the time-based cost estimate."""
    gpu: str | None = None
    """Device to size the memory estimate against (e.g. a100-80gb, h100-80gb, l4-24gb, cpu)."""

    def __post_init__(self) -> None:
        self._check_auto_int("epochs", minimum=1)
        self._check_auto_int("batch_size", minimum=1)
        self._check_auto_int("lora_rank", minimum=1)
        self._check_auto_int("eval_every", minimum=1)
        self._check_auto_int("save_every", minimum=1)
        self._check_choice("method", ("lora", "full"))
        self._check_choice("record_policy", ("all", "last", "each"))
        self._check_choice("truncation", ("left", "drop"))
        self._check_choice("last_batch", ("keep", "drop"))
        self._check_choice("schedule", ("linear", "cosine"))
        self._check_choice("dtype", ("auto", "fp32", "bf16"))
        self._check_choice("shard", ("auto", "full", "none"))
        for name in ("grad_accum", "devices", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{_flag(name)} must be a whole number of at least 1, got {value!r}")
        if self.shard == "full" and self.method == "lora":
            raise ConfigError(
                "--shard full shards full fine-tuning (--method full); LoRA replicates the model: --shard none"
            )
        if self.keep_checkpoints < 1:
            raise ConfigError(f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.lr != AUTO and (not isinstance(self.lr, int | float) or not 0 < self.lr < 1):
            raise ConfigError(f"--lr must be a number between 0 and 1 (e.g. 2e-4) or 'auto', got {self.lr!r}")
        if self.lora_alpha != AUTO and (not isinstance(self.lora_alpha, int | float) or self.lora_alpha <= 0):
            raise ConfigError(f"--lora-alpha must be a positive number or 'auto', got {self.lora_alpha!r}")
        if self.val_fraction != AUTO and (
            not isinstance(self.val_fraction, int | float) or not 0 <= self.val_fraction < 1
        ):
            raise ConfigError(f"--val-fraction must be at least 0 and below 1, or 'auto', got {self.val_fraction!r}")
        if self.warmup_ratio is not None and not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"--warmup-ratio must be at least 0 and below 1, got {self.warmup_ratio}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ConfigError(f"--warmup-steps must be 0 or more, got {self.warmup_steps}")
        if self.weight_decay < 0:
            raise ConfigError(f"--weight-decay must be 0 or more, got {self.weight_decay}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"--max-grad-norm must be positive, got {self.max_grad_norm}")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"--lora-dropout must be at least 0 and below 1, got {self.lora_dropout}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max-steps must be at least 1, got {self.max_steps}")
        for name in ("price_per_million_tokens", "gpu_hour_price"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{_flag(name)} must be 0 or more, got {value}")

    def _check_auto_int(self, name: str, minimum: int) -> None:
        value = getattr(self, name)
        if value == AUTO:
            return
        if isinstance(value, str) and value.isdigit():
            value = int(value)
            setattr(self, name, value)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"{_flag(name)} must be a whole number of at least {minimum} or 'auto', got {value!r}")

    def _check_choice(self, name: str, choices: tuple[str, ...]) -> None:
        value = getattr(self, name)
        if value not in choices:
            raise ConfigError(f"{_flag(name)} must be one of {', '.join(choices)}; got {value!r}")

    # ---- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> RunConfig:
        """Read a YAML file of settings (keys as in RunConfig, dashes allowed); `overrides` win."""
        import yaml

        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read the config file: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: a config file must be a mapping of setting: value")
        values = {str(k).replace("-", "_"): v for k, v in loaded.items()}
        values.update(overrides)
        return cls.from_dict(values)
