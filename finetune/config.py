"""RunConfig: the one declaration of every setting of a run, with "auto" where Auto can choose.

A setting is declared once, as a field of RunConfig: its type (``Literal[...]``, or a StrEnum the data
path names its choices with, gives the choices; ``int | str`` means a number or "auto"; ``X | None`` means
it may be left unset), its default, and the docstring under it (the help text). Everything else is derived from that declaration by `settings()`:

- the command-line flags (cli.py adds one `--flag-name` per field to `plan`, `train` and `validate`),
- the YAML keys of `--config` (the field names; dashes allowed),
- the type and choice checks (`Setting.coerce`, run in `__post_init__` for the CLI, YAML and library alike).

Why hand-rolled introspection rather than a library (tyro, simple-parsing, pydantic-settings)? The
declaration is a plain dataclass the library, the YAML file and the CLI share; ~80 lines of
`typing.get_type_hints` + `ast` (for the field docstrings) keep it that way, keep `finetune plan`
importable without heavy dependencies, and keep every existing flag spelling (`--no-packing`, `auto`).

Ranges (at least 1, between 0 and 1, ...) are checked in `__post_init__`; the settings each command
needs are checked in one place, `check_required`.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import math
import textwrap
import types
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from finetune.data.types import RecordPolicy, Truncation
from finetune.errors import UserError

AUTO = "auto"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(UserError, ValueError):
    """A setting has a value that cannot work; the message names the flag."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass
class RunConfig:
    # ---- data
    data: str | None = None
    """Training file: OpenAI chat, ShareGPT, Alpaca or prompt/completion JSONL (also .jsonl.gz, .parquet)."""
    format: Literal["auto", "chat", "prompt_completion", "sharegpt", "alpaca"] = AUTO
    """Data format; auto detects it from the file's first line in a known format (docs/formats.md)."""
    skip_invalid: bool = False
    """Train on the valid lines and list every invalid one in OUT/skipped.jsonl (default: stop on any error)."""
    val_file: str | None = None
    """Use this file as the validation set instead of cutting one from `data`."""
    val_fraction: float | str = AUTO
    """Share of conversations held out for validation; 0 disables validation; auto picks from the data size."""
    test_fraction: float = 0.0
    """Share of conversations held out as a test set, from both training and validation (OUT/test.jsonl)."""
    record_policy: RecordPolicy = RecordPolicy.ALL
    """How a conversation becomes records: all targets in one record, only the last, or one record per target."""
    max_seq_len: int = 1024
    """Longest record in tokens; longer ones are handled by `truncation`."""
    truncation: Truncation = Truncation.LEFT
    """Over-long records: drop context from the left (never a target), or drop the record."""
    cache: bool = True
    """Keep the tokenized data in the token cache and reuse it (off: --no-cache tokenizes every time)."""
    cache_dir: str | None = None
    """Token cache folder (default $FINETUNE_CACHE_DIR, else ~/.cache/finetune/tokens); safe to delete."""

    # ---- model
    model: str | None = None
    """Hub id, local folder (safetensors), GGUF file, or a base pulled with `finetune base pull NAME`."""
    method: Literal["lora", "full", "dpo"] = "lora"
    """Train a LoRA adapter or every weight of the model, or preference-tune (dpo) on chosen/rejected pairs."""
    base_method: Literal["lora", "full"] = "lora"
    """With --method dpo: which weights preference tuning trains (a LoRA adapter or every weight)."""
    beta: float | str = AUTO
    """With --method dpo: how far the tuned model may move from the starting one (DPO's beta); auto = 0.1."""
    sft_weight: float = 0.0
    """With --method dpo: add this many times the supervised loss of the chosen answers (0 = pure DPO)."""
    lora_rank: int | str = AUTO
    """LoRA rank r; auto scales it with the data size."""
    lora_alpha: float | str = AUTO
    """LoRA alpha; auto = 2 x rank."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA path."""
    lora_train_head: bool | str = AUTO
    """With LoRA: also train the output layer (LM head) in full; auto when it is no bigger than the adapter."""
    trust_remote_code: bool = False
    """Run code shipped with the model folder (off unless you trust it)."""
    chat_template: str = AUTO
    """Chat template: auto = the model's own, else ChatML when it has none (a base model); chatml; or a Jinja file."""

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
    """Continue from the newest good checkpoint in `out` (from step 0 when there is none)."""
    allow_changes: str | None = None
    """With --resume: settings that may differ from the checkpoint's, e.g. lr,data (recorded in the report)."""
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
        for spec in settings():  # types and choices, from the annotations
            setattr(self, spec.name, spec.coerce(getattr(self, spec.name)))
        # ranges: what the types cannot say
        for name in ("epochs", "batch_size", "lora_rank", "eval_every", "save_every"):
            self._at_least(name, 1)
        for name in ("grad_accum", "devices", "max_seq_len", "keep_checkpoints", "max_steps"):
            self._at_least(name, 1)
        for name in ("warmup_steps", "weight_decay", "price_per_million_tokens", "gpu_hour_price", "seed"):
            self._at_least(name, 0)
        if self.val_file and self.val_fraction != AUTO:
            raise ConfigError(
                "--val-file and --val-fraction cannot be used together: the file is the validation set, "
                "so nothing is held out of the training data; drop --val-fraction"
            )
        if self.allow_changes:
            from finetune.train.fingerprint import parse_allowed  # light: hashlib and json, no torch

            parse_allowed(self.allow_changes)
        if self.method != "dpo":
            for name, default in (("beta", AUTO), ("sft_weight", 0.0), ("base_method", "lora")):
                if getattr(self, name) != default:
                    flag = "--" + name.replace("_", "-")
                    raise ConfigError(f"{flag} is a preference-tuning setting: use it with --method dpo")
        if self.beta != AUTO and self.beta <= 0:
            raise ConfigError(f"--beta must be a positive number or 'auto', got {self.beta!r}")
        self._at_least("sft_weight", 0)
        if self.shard == "full" and self.trained_weights == "lora":
            raise ConfigError(
                "--shard full shards full fine-tuning (--method full); LoRA replicates the model: --shard none"
            )
        if self.lr != AUTO and not 0 < self.lr < 1:
            raise ConfigError(f"--lr must be a number between 0 and 1 (e.g. 2e-4) or 'auto', got {self.lr!r}")
        if self.lora_alpha != AUTO and self.lora_alpha <= 0:
            raise ConfigError(f"--lora-alpha must be a positive number or 'auto', got {self.lora_alpha!r}")
        if self.val_fraction != AUTO and not 0 <= self.val_fraction < 1:
            raise ConfigError(f"--val-fraction must be at least 0 and below 1, or 'auto', got {self.val_fraction!r}")
        if not 0 <= self.test_fraction < 1:
            raise ConfigError(f"--test-fraction must be at least 0 and below 1, got {self.test_fraction!r}")
        if self.warmup_ratio is not None and not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"--warmup-ratio must be at least 0 and below 1, got {self.warmup_ratio}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"--max-grad-norm must be positive, got {self.max_grad_norm}")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"--lora-dropout must be at least 0 and below 1, got {self.lora_dropout}")

    @property
    def trained_weights(self) -> str:
        """lora or full: what the run trains (for dpo, its --base-method)."""
        return self.base_method if self.method == "dpo" else self.method

    def _at_least(self, name: str, minimum: int) -> None:
        value = getattr(self, name)
        if value is not None and value != AUTO and value < minimum:
            auto = " or 'auto'" if setting(name).auto else ""
            raise ConfigError(f"{_flag(name)} must be at least {minimum}{auto}, got {value!r}")

    def check_required(self, command: str) -> None:
        """The settings `command` cannot run without: the one place they are checked (CLI and library)."""
        for name in REQUIRED.get(command, ()):
            if getattr(self, name) in (None, ""):
                raise ConfigError(MISSING[name])

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


# ----------------------------------------------------------------------------- settings, derived from RunConfig

# the data settings: how a file becomes training records; `validate`, `plan` and `train` all take them
DATA_SETTINGS = ("val_file", "val_fraction", "record_policy", "max_seq_len", "truncation", "format")
# settings only a run has (plan takes every other one: it shows what train would do)
TRAIN_ONLY = ("out", "resume", "allow_changes", "keep_checkpoints", "test_fraction")
# positional arguments of the commands rather than flags
POSITIONAL = ("data",)
REQUIRED = {"train": ("data", "model", "out")}
MISSING = {
    "data": "no training file: pass DATA.jsonl (or `data:` in --config)",
    "model": "no model: pass --model (a hub id, a local folder, a .gguf file or a pulled base's name)",
    "out": "no output folder: pass --out DIR",
}


@dataclass(frozen=True)
class Setting:
    """One field of RunConfig as the CLI, the YAML reader and the checks see it."""

    name: str
    kind: type  # int, float, bool or str
    choices: tuple[str, ...] | None  # from Literal[...]
    auto: bool  # "auto" is a legal value
    optional: bool  # None is a legal value (left unset)
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return _flag(self.name)

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        what = {int: "a whole number", float: "a number", bool: "on or off", str: "text"}[self.kind]
        return what + (" or 'auto'" if self.auto else "")

    def parse(self, text: str) -> Any:
        """A value written as text (a flag, a YAML string) -> its Python value; ValueError when it is none."""
        lowered = text.strip().lower()
        if self.auto and lowered == AUTO:
            return AUTO
        if self.optional and self.kind is not str and lowered == "none":
            return None
        if self.choices or self.kind is str:
            return text
        if self.kind is bool:
            if lowered in _TRUE + _FALSE:
                return lowered in _TRUE
            raise ValueError(text)
        return self.kind(text)

    def coerce(self, value: Any) -> Any:
        """Check a value against the declaration (parsing text); raises ConfigError naming the flag."""
        if value is None:
            if self.optional:
                return None
            raise ConfigError(f"{self.flag} needs a value: {self.describe()}")
        bad = ConfigError(f"{self.flag} must be {self.describe()}, got {value!r}")
        if isinstance(value, str) and self.kind is not str:
            try:
                value = self.parse(value)
            except ValueError:
                raise bad from None
            if value is None:  # "none": left unset
                return None
        if self.choices:
            if value not in self.choices:
                raise bad
            value = self.choices[self.choices.index(value)]  # a plain string, also for a StrEnum member
        elif self.auto and value == AUTO:
            pass
        elif self.kind is bool:
            if not isinstance(value, bool):
                raise bad
        elif self.kind is int:
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad
        elif self.kind is float:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise bad
            value = float(value)
            if not math.isfinite(value):  # nan and inf pass every range check: refuse them by name
                raise ConfigError(f"{self.flag} must be a finite number, got {value!r}")
        elif not isinstance(value, str):
            raise bad
        return value


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field (Python keeps none of them at run time, so read the source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        if documented and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _setting(f: dataclasses.Field, hint: Any, help_text: str) -> Setting:
    choices = None
    optional = auto = False
    if get_origin(hint) is Literal:
        kind, choices = str, tuple(get_args(hint))
        auto = AUTO in choices
    elif isinstance(hint, type) and issubclass(hint, enum.StrEnum):  # the data path's own names for its choices
        kind, choices = str, tuple(member.value for member in hint)
    elif get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        optional = len(args) < len(get_args(hint))
        auto = str in args and len(args) > 1
        kind = next(a for a in args if a is not str) if auto else args[0]
    else:
        kind = hint
    return Setting(f.name, kind, choices, auto, optional, f.default, help_text)


@cache
def settings() -> tuple[Setting, ...]:
    """Every setting of RunConfig, in declaration order."""
    hints = get_type_hints(RunConfig)
    docs = _field_docs(RunConfig)
    return tuple(_setting(f, hints[f.name], docs.get(f.name, "")) for f in fields(RunConfig))


def command_settings(command: str) -> tuple[Setting, ...]:
    """The settings a command takes as flags: `validate` the data ones, `plan` all but a run's own, `train` all."""
    if command == "validate":
        chosen = (s for s in settings() if s.name in DATA_SETTINGS + ("model", "trust_remote_code"))
    elif command == "plan":
        chosen = (s for s in settings() if s.name not in TRAIN_ONLY)
    else:
        chosen = iter(settings())
    return tuple(s for s in chosen if s.name not in POSITIONAL)


def setting(name: str) -> Setting:
    return next(s for s in settings() if s.name == name)
