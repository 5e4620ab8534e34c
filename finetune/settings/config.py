"""RunConfig: the one declaration of every setting of a run, with "auto" where Auto can choose.

A setting is declared once, as a field of RunConfig: its type, its default, its About (label, API name,
whether it changes the tokens, its resume policy, when it applies: `about(default, label, ...)`) and the
docstring under it (the help text). Flags, YAML keys, checks, the token cache's key, the resume fingerprint,
the OpenAI mapping, every label table and the dashboard's schema are generated from it (registry.py).

Ranges (at least 1, between 0 and 1, ...) are checked in `__post_init__`; the settings each command needs are
checked in one place, `check_required`. Messages name settings with `wording.ref`, so each reader sees them
in their own terms (a flag, an API key, a field's label).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from finetune.settings.coerce import coerce
from finetune.settings.data_choices import RecordPolicy, Truncation
from finetune.settings.errors import ConfigError
from finetune.settings.fingerprint import parse_allowed
from finetune.settings.registry import AUTO, about, declares_settings, setting, settings
from finetune.settings.tracker_options import check_installed, parse_report_to, parse_tracker_options
from finetune.settings.wording import ref

__all__ = ["AUTO", "ConfigError", "RunConfig"]


@declares_settings
@dataclass
class RunConfig:
    # ---- data
    data: str | None = about(None, "Training data", tokens=False, resume="allow", api=None, api_param="training_file",
                             plan_key=None, positional=True)  # fmt: skip
    """Training file: OpenAI chat, ShareGPT, Alpaca or prompt/completion JSONL (also .jsonl.gz, .parquet)."""
    format: Literal["auto", "chat", "prompt_completion", "sharegpt", "alpaca"] = about(
        AUTO, "Data format", plan_key=None, validate=True
    )
    """Data format; auto detects it from the file's first line in a known format (docs/formats.md)."""
    skip_invalid: bool = about(False, "Skip invalid lines", plan_key=None)
    """Train on the valid lines and list every invalid one in OUT/skipped.jsonl (default: stop on any error)."""
    val_file: str | None = about(None, "Validation data", tokens=False, resume="allow", api=None,
                                 api_param="validation_file", plan_key=None, validate=True)  # fmt: skip
    """Use this file as the validation set instead of cutting one from `data`."""
    val_fraction: float | str = about(AUTO, "Validation share", resume="allow", plan_key=None, validate=True)
    """Share of conversations held out for validation; 0 disables validation; auto picks from the data size."""
    test_fraction: float = about(0.0, "Test share", tokens=False, plan_key=None, train_only=True)
    """Share of conversations held out as a test set, from both training and validation (OUT/test.jsonl)."""
    record_policy: RecordPolicy = about(RecordPolicy.ALL, "Records per conversation", plan_key=None, validate=True)
    """How a conversation becomes records: all targets in one record, only the last, or one record per target."""
    max_seq_len: int | str = about(AUTO, "Max sequence length", validate=True)
    """Longest record in tokens; auto = the longest record when the model and memory allow it (docs/auto.md)."""
    truncation: Truncation = about(Truncation.LEFT, "Over-long records", plan_key=None, validate=True)
    """Over-long records: left = split into records that fit, earlier turns as context (docs/formats.md); drop."""
    strict: bool = about(False, "Strict", tokens=False, plan_key=None, validate=True)
    """Fail instead of splitting, shortening or dropping over-long records or skipping anything."""
    cache: bool = about(True, "Token cache", tokens=False, api=None, plan_key=None)
    """Keep the tokenized data in the token cache and reuse it (off: tokenize every time, write nothing)."""
    cache_dir: str | None = about(None, "Token cache folder", tokens=False, api=None, plan_key=None)
    """Token cache folder (default $FINETUNE_CACHE/tokens, else ~/.cache/finetune/tokens); safe to delete."""

    # ---- model
    model: str | None = about(None, "Model", tokens=False, resume="allow", api=None, api_param="model",
                              validate=True)  # fmt: skip
    """Hub id, local folder (safetensors), GGUF file, or a base pulled with `finetune base pull NAME`."""
    method: Literal["lora", "full", "dpo"] = about(
        "lora", "Method", tokens=False, resume="refuse", plan_key=None,
        why_not="the checkpoint holds weights of the other method",
    )  # fmt: skip
    """Train a LoRA adapter or every weight of the model, or preference-tune (dpo) on chosen/rejected pairs."""
    base_method: Literal["lora", "full"] = about(
        "lora", "Weights preference tuning trains", tokens=False, resume="refuse", api="method", plan_key=None,
        when="dpo", why_not="the checkpoint holds weights of the other method",
    )  # fmt: skip
    """Preference tuning only: which weights preference tuning trains (a LoRA adapter or every weight)."""
    beta: float | str = about(AUTO, "Beta", tokens=False, resume="allow", when="dpo")
    """Preference tuning only: how far the tuned model may move from the starting one (DPO's beta); auto = 0.1."""
    sft_weight: float = about(0.0, "SFT weight", tokens=False, resume="allow", when="dpo")
    """Preference tuning only: add this many times the supervised loss of the chosen answers (0 = pure DPO)."""
    lora_rank: int | str = about(AUTO, "LoRA rank", tokens=False, resume="refuse", when="lora",
                                 why_not="the checkpoint's adapter has another shape")  # fmt: skip
    """LoRA rank r; auto scales it with the data size."""
    lora_alpha: float | str = about(AUTO, "LoRA alpha", tokens=False, resume="allow", when="lora")
    """LoRA alpha; auto = 2 x rank."""
    lora_dropout: float = about(0.0, "LoRA dropout", tokens=False, when="lora")
    """Dropout on the LoRA path."""
    lora_train_head: bool | str = about(
        AUTO, "LoRA trains the output layer", tokens=False, resume="refuse", when="lora",
        why_not="the checkpoint's adapter holds other weights",
    )  # fmt: skip
    """With LoRA: also train the output layer (LM head) in full; auto when it is no bigger than the adapter."""
    trust_remote_code: bool = about(False, "Run the model's own code", tokens=False, api=None, plan_key=None,
                                    validate=True)  # fmt: skip
    """Run code shipped with the model folder (off unless you trust it)."""
    chat_template: str = about(
        AUTO, "Chat template", resume="refuse", api=None, plan_key=None, validate=True,
        why_not="the checkpoint's embeddings were sized for the other template's special tokens",
    )  # fmt: skip
    """Chat template: auto = the model's own, else ChatML when it has none (a base model); chatml; or a Jinja file."""

    # ---- schedule and batch
    epochs: int | str = about(AUTO, "Epochs", tokens=False, api="n_epochs")
    """Passes over the training records."""
    batch_size: int | str = about(AUTO, "Batch size", tokens=False)
    """Records per micro-batch on each device."""
    grad_accum: int = about(1, "Gradient accumulation", tokens=False)
    """Micro-batches accumulated into one optimizer step."""
    devices: int = about(1, "Devices", tokens=False)
    """Processes (GPUs, or CPU processes with gloo) that train together."""
    lr: float | str = about(AUTO, "Learning rate", tokens=False, resume="allow", api="learning_rate",
                            api_mention="learning_rate_multiplier", plan_key="learning_rate")  # fmt: skip
    """Peak learning rate; auto by method, effective batch and model width."""
    lr_multiplier: float = about(1.0, "Learning rate multiplier", tokens=False, api="learning_rate_multiplier")
    """Multiply the learning rate (Auto's or yours) by this factor (OpenAI's learning_rate_multiplier)."""
    warmup_ratio: float | None = about(None, "Warmup share", tokens=False)
    """Share of total steps used for linear warmup (default 0.05 when no warmup steps are given)."""
    warmup_steps: int | None = about(None, "Warmup steps", tokens=False, resume="allow")
    """Warmup in steps; overrides warmup_ratio."""
    last_batch: Literal["keep", "drop"] = about("keep", "Last partial batch", tokens=False)
    """Keep or drop the last partial batch of each epoch."""
    schedule: Literal["linear", "cosine"] = about("cosine", "Schedule", tokens=False, resume="allow")
    """Decay after warmup, to zero at the last step."""
    weight_decay: float = about(0.0, "Weight decay", tokens=False)
    """AdamW decoupled weight decay (never applied to biases and norms)."""
    max_grad_norm: float | None = about(1.0, "Gradient clipping", tokens=False)
    """Clip the global gradient norm to this value; None disables clipping."""
    seed: int = about(0, "Seed", resume="refuse", api=None, api_param="seed",
                      why_not="the split and the order of the records depend on it")  # fmt: skip
    """Seed for the split, the shuffling, LoRA init and dropout."""

    # ---- run
    out: str | None = about(None, "Output folder", tokens=False, api=None, plan_key=None, train_only=True)
    """Output folder of the run."""
    eval_every: int | str = about(AUTO, "Evaluate every", tokens=False)
    """Validation every N optimizer steps (and at each epoch end); auto = about 10 evaluations per run."""
    save_every: int | str = about(AUTO, "Checkpoint every", tokens=False)
    """Checkpoint every N optimizer steps (and at the end); auto = at each evaluation."""
    keep_checkpoints: int = about(2, "Checkpoints kept", tokens=False, train_only=True)
    """Keep the last K checkpoints, plus the best by validation loss."""
    resume: bool = about(False, "Resume", tokens=False, api=None, plan_key=None, train_only=True)
    """Continue from the newest good checkpoint in `out` (from step 0 when there is none)."""
    allow_changes: str | None = about(None, "Changes allowed on resume", tokens=False, api=None, plan_key=None,
                                      train_only=True)  # fmt: skip
    """When resuming: settings that may differ from the checkpoint's, e.g. lr,data (recorded in the report)."""
    max_steps: int | None = about(None, "Max steps", tokens=False, plan_key=None)
    """Stop after this many optimizer steps (the plan is cut to it)."""
    gradient_checkpointing: bool | str = about(AUTO, "Gradient checkpointing", tokens=False)
    """Recompute activations in the backward pass to save memory; auto from the memory estimate."""
    dtype: Literal["auto", "fp32", "bf16"] = about(AUTO, "Precision", tokens=False)
    """Precision of every model of the run: auto = bf16 on a GPU, and on a CPU with bf16 matrix instructions for
    models at least 256 wide (measured faster); fp32 otherwise. bf16 keeps trained weights and AdamW in fp32."""
    shard: Literal["auto", "full", "none"] = about(AUTO, "Sharding (FSDP)", tokens=False)
    """Multi-device: FSDP-shard the model (full) or replicate it (DDP, none); auto from the memory estimate."""
    packing: bool = about(True, "Packing", tokens=False)
    """Padding-free packing of records into rows."""
    report_to: str | None = about(None, "Trackers", tokens=False, api=None, plan_key=None, train_only=True)
    """Send each step's metrics, the plan and the outputs to these trackers: any of tensorboard,mlflow,wandb."""
    tracker_options: str | None = about(None, "Tracker options", tokens=False, api=None, plan_key=None,
                                        train_only=True)  # fmt: skip
    """With trackers: names and tags for them as JSON, e.g. {"wandb": {"project": "p"}} (never credentials)."""

    # ---- money
    price_per_million_tokens: float | None = about(None, "Price per million tokens", tokens=False, api=None,
                                                   plan_key=None)  # fmt: skip
    """Price per million training tokens processed, for the cost estimate."""
    gpu_hour_price: float | None = about(None, "Price per device-hour", tokens=False, api=None, plan_key=None)
    """Price of one device-hour, for the time-based cost estimate."""
    gpu: str | None = about(None, "Device", tokens=False, api=None, plan_key=None)
    """Device to size the memory estimate against (e.g. a100-80gb, h100-80gb, l4-24gb, cpu)."""

    # ---- data protection
    sensitive_data: Literal["warn", "redact", "refuse"] = about(
        "warn", "Sensitive data", resume="refuse", validate=True,
        why_not="the checkpoint learned from the data with its sensitive values treated the other way",
    )  # fmt: skip
    """E-mails, phone numbers, card numbers, IBANs and secrets found in the data: warn, redact (replace each with a
    placeholder such as <EMAIL> before tokenizing) or refuse to train (docs/sensitive-data.md)."""

    # ---- retention
    replay: float | str = about(
        AUTO, "Self-replay", tokens=False, resume="refuse", words=("off",),
        why_not="the checkpoint learned from another mix of general and team conversations",
    )  # fmt: skip
    """Mix general requests answered by the base model itself into training: replay rows per team row (e.g. 0.25),
    auto (1 per 4 team rows on a real base; off below 10M parameters and for preference tuning), or off
    (docs/retention.md, "Self-replay")."""
    general_data: str | None = about(
        None, "General conversations", tokens=False, resume="refuse", api_file=True,
        why_not="the checkpoint learned from other general conversations",
    )  # fmt: skip
    """With replay: your own general conversations (a chat file) to mix in instead of the base model's answers."""
    adapter_scale: float | str = about(
        AUTO, "Adapter scale", tokens=False, resume="refuse", when="lora", words=("off",),
        why_not="a run's final adapter, report and model card are made with one scale",
    )  # fmt: skip
    """LoRA: after training, scale the adapter back toward the base (base + scale x update): a number above 0 and at
    most 1, auto (the smallest scale that keeps the fit to the validation set; off below 10M parameters), or off
    (docs/retention.md)."""
    replay_targets: Literal["text", "soft"] = about(
        "text", "Replay targets", tokens=False, resume="refuse", when="lora",
        why_not="the checkpoint learned the replay rows with the other loss",
    )  # fmt: skip
    """LoRA with replay: what a replay row teaches: text (the cross-entropy of the base's greedy answer, as any reply)
    or soft (at each answer token, the divergence from the base's whole next-token distribution; docs/retention.md)."""
    team_system: str | None = about(
        None, "The team's system message", tokens=False, resume="refuse",
        why_not="the checkpoint learned the team's replies in another context",
    )  # fmt: skip
    """Put this system message on every team conversation that has none (training, validation, the test set, chat
    and serving of the run), never on replay rows or general prompts: the team's voice bound to the team's context
    (docs/retention.md)."""
    general_val: bool | str = about(AUTO, "Forgetting curve", tokens=False, resume="allow")
    """A second validation curve: the loss on held-out general prompts answered by the base model, never trained on
    (general_val_loss at each evaluation); auto = on when replay draws on the base's answers (docs/retention.md)."""

    def __post_init__(self) -> None:
        for spec in settings():  # types and choices, from the annotations
            setattr(self, spec.name, coerce(spec, getattr(self, spec.name)))
        # ranges: what the types cannot say
        for name in ("epochs", "batch_size", "lora_rank", "eval_every", "save_every", "grad_accum", "devices"):
            self._at_least(name, 1)
        for name in ("max_seq_len", "keep_checkpoints", "max_steps"):
            self._at_least(name, 1)
        for name in ("warmup_steps", "weight_decay", "price_per_million_tokens", "gpu_hour_price", "seed"):
            self._at_least(name, 0)
        self._at_least("sft_weight", 0)
        self._between("val_fraction", 0, 1)
        self._between("test_fraction", 0, 1)
        if self.warmup_ratio is not None and not 0 <= self.warmup_ratio <= 1:
            raise ConfigError(f"{ref('warmup_ratio')} must be between 0 and 1, got {self.warmup_ratio!r}")
        self._between("lora_dropout", 0, 1)
        for name in ("beta", "lora_alpha", "max_grad_norm", "lr_multiplier"):
            self._positive(name)
        if self.lr != AUTO and not 0 < self.lr < 1:
            raise ConfigError(f"{ref('lr')} must be a number between 0 and 1 (e.g. 2e-4) or 'auto', got {self.lr!r}")
        self._check_combinations()
        self._check_replay()
        self._check_adapter_scale()
        self._check_trackers()

    def _check_combinations(self) -> None:
        if self.strict and self.skip_invalid:
            raise ConfigError(
                f"{ref('strict')} fails on any line it would leave out, so it cannot go with {ref('skip_invalid')}"
            )
        if self.val_file and self.val_fraction != AUTO:
            raise ConfigError(
                f"{ref('val_file')} and {ref('val_fraction')} cannot be used together: the file is the validation "
                f"set, so nothing is held out of the training data; drop {ref('val_fraction')}"
            )
        if self.allow_changes:
            parse_allowed(self.allow_changes)
        if self.method != "dpo":
            for spec in settings():
                if spec.about.when == "dpo" and getattr(self, spec.name) != spec.default:
                    raise ConfigError(
                        f"{ref(spec.name)} is a preference-tuning setting: use it with {ref('method', 'dpo')}"
                    )
        elif self.test_fraction:
            raise ConfigError(
                f"{ref('test_fraction')} holds out conversations for `finetune eval`, which scores supervised "
                f"answers; it does not apply to {ref('method', 'dpo')}. The validation split already holds out whole "
                f"prompts and reports their reward accuracy (val_reward_accuracy): use {ref('val_fraction')}, or "
                f"{ref('val_file')} with pairs of prompts kept apart."
            )
        if self.shard == "full" and self.trained_weights == "lora":
            raise ConfigError(
                f"{ref('shard')} full shards full fine-tuning; LoRA replicates the model: {ref('shard')} none"
            )

    def _check_replay(self) -> None:
        if self.replay not in ("off", AUTO) and not 0 < self.replay <= 10:
            raise ConfigError(
                f"{ref('replay')} must be a number of replay rows per team row above 0 and at most 10 (e.g. 0.25), "
                f"'auto' or 'off', got {self.replay!r}"
            )
        if self.general_data and self.replay == "off":
            raise ConfigError(f"{ref('general_data')} is mixed in by replay: set {ref('replay')} to auto or a ratio")
        if self.replay not in ("off", AUTO) and self.method == "dpo":
            raise ConfigError(f"{ref('replay')} mixes supervised answers; it does not apply to {ref('method', 'dpo')}")
        if self.replay_targets == "soft" and (self.replay == "off" or self.trained_weights == "full"):
            raise ConfigError(
                f"{ref('replay_targets')} soft trains replay rows toward the base's distribution, read from the LoRA "
                f"adapter switched off: it needs {ref('replay')} on and {ref('method', 'lora')}"
            )
        if self.team_system is not None and not self.team_system.strip():
            raise ConfigError(f"{ref('team_system')} is empty: give the team's system message, or leave it unset")
        if self.team_system is not None and self.method == "dpo":
            raise ConfigError(f"{ref('team_system')} binds supervised replies to the team's context; it does not apply "
                              f"to {ref('method', 'dpo')}: put the system message in the pairs' prompts")  # fmt: skip
        if self.general_val is True and self.method == "dpo":
            raise ConfigError(
                f"{ref('general_val')} scores supervised answers; it does not apply to {ref('method', 'dpo')}"
            )

    def _check_adapter_scale(self) -> None:
        if self.adapter_scale in ("off", AUTO):
            return
        if not 0 < self.adapter_scale <= 1:
            raise ConfigError(
                f"{ref('adapter_scale')} must be a number above 0 and at most 1 (e.g. 0.5: half of the trained "
                f"update), 'auto' or 'off', got {self.adapter_scale!r}"
            )
        if self.trained_weights == "full":
            raise ConfigError(
                f"{ref('adapter_scale')} scales a LoRA adapter; {ref('method', 'full')} trains every weight and has "
                f"none: use {ref('method', 'lora')}, or leave {ref('adapter_scale')} off"
            )

    @property
    def trained_weights(self) -> str:
        """lora or full: what the run trains (for preference tuning, its base_method)."""
        return self.base_method if self.method == "dpo" else self.method

    @property
    def objective(self) -> str:
        """sft (the team's answers) or dpo (chosen over rejected answers): what a step minimises."""
        return "dpo" if self.method == "dpo" else "sft"

    def _at_least(self, name: str, minimum: int) -> None:
        value = getattr(self, name)
        if value is not None and value != AUTO and value < minimum:
            auto = " or 'auto'" if setting_is_auto(name) else ""
            raise ConfigError(f"{ref(name)} must be at least {minimum}{auto}, got {value!r}")

    def _between(self, name: str, low: float, high: float) -> None:
        """low <= value < high."""
        value = getattr(self, name)
        if value is not None and value != AUTO and not low <= value < high:
            auto = ", or 'auto'" if setting_is_auto(name) else ""
            raise ConfigError(f"{ref(name)} must be at least {low} and below {high}{auto}, got {value!r}")

    def _positive(self, name: str) -> None:
        value = getattr(self, name)
        if value is not None and value != AUTO and value <= 0:
            auto = " or 'auto'" if setting_is_auto(name) else ""
            raise ConfigError(f"{ref(name)} must be a positive number{auto}, got {value!r}")

    def check_required(self, command: str) -> None:
        """The settings `command` cannot run without: the one place they are checked (CLI and library)."""
        for name in REQUIRED.get(command, ()):
            if getattr(self, name) in (None, ""):
                raise ConfigError(MISSING[name])
        if command == "train":
            check_installed(self.report_to)  # before anything is written: a missing library is one sentence

    def _check_trackers(self) -> None:
        """report_to names known trackers; tracker_options fits them (docs/trackers.md)."""
        self.report_to = parse_report_to(self.report_to)
        parse_tracker_options(self.tracker_options, self.report_to)

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


def setting_is_auto(name: str) -> bool:
    return setting(name).auto


REQUIRED = {"train": ("data", "model", "out")}
MISSING = {
    "data": "no training file: pass DATA.jsonl (or `data:` in --config)",
    "model": f"no model: pass {ref('model')} (a hub id, a local folder, a .gguf file or a pulled base's name)",
    "out": f"no output folder: pass {ref('out')} DIR",
}
