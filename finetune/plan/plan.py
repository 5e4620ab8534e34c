"""RunConfig + the data's numbers + the model's numbers -> Plan: pure, no torch import.

    plan = build_plan(config, prepared.facts, load_model_facts(config.model), prepared.warnings)
    plan.total_steps, plan.batch_size, plan.learning_rate, ...   # what the training loop obeys
    plan.to_dict()                                              # plan.json / `finetune plan --json`

Every value the user left on "auto" is chosen by the rules in auto.py and lands in `plan.auto`
with its reason; the advice (warnings with stable codes) comes from advice.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from finetune.config import AUTO, RunConfig
from finetune.data.tokenize import describe_chat_template
from finetune.data.types import DataSummary
from finetune.errors import UserError
from finetune.model_source import origin
from finetune.plan import arithmetic
from finetune.plan.advice import AdviceContext, advise
from finetune.plan.auto import (
    DEFAULT_WARMUP_RATIO,
    auto_batch_size,
    auto_epochs,
    auto_eval_every,
    auto_lora_alpha,
    auto_lora_rank,
    auto_lora_train_head,
    auto_lr,
    auto_save_every,
    auto_warmup_steps,
)
from finetune.plan.cost import CostEstimate, estimate_cost
from finetune.plan.memory import (
    MemoryEstimate,
    decide_gradient_checkpointing,
    decide_shard,
    estimate_memory,
    resolve_device,
)
from finetune.plan.model_facts import ModelFacts
from finetune.plan.preference import auto_beta, auto_dpo_epochs, auto_dpo_lr


def what_if_summary(config: RunConfig, examples: int, tokens: int | None) -> DataSummary:
    """A what-if plan: `examples` training records (after the validation split), `tokens` in them.

    The validation side is estimated from --val-fraction (or Auto's rule for the whole file), assuming one
    record per conversation unless --record-policy each.
    """
    if examples < 1:
        raise UserError(f"--examples must be at least 1, got {examples}")
    if tokens is not None and tokens < 0:
        raise UserError(f"--tokens must be 0 or more, got {tokens}")
    one_per_conversation = config.record_policy != "each"
    if config.val_file:
        val, fraction, reason = None, 0.0, f"your validation file {config.val_file} (not read in a what-if plan)"
    elif config.val_fraction == AUTO:
        from finetune.data.split import auto_val_fraction  # no torch on this path

        fraction, _ = auto_val_fraction(examples)
        whole = round(examples / (1 - fraction)) if fraction else examples
        fraction, reason = auto_val_fraction(whole)
        val = round(fraction * whole)
        reason = f"{reason} (estimated for about {whole:,} conversations in the whole file)"
    else:
        fraction = float(config.val_fraction)
        val = round(examples * fraction / (1 - fraction))
        reason = "validation off (--val-fraction 0)" if fraction == 0 else f"your --val-fraction {fraction}"
    return DataSummary(
        examples=examples,
        validation_examples=val,
        conversations=examples if one_per_conversation else None,
        validation_conversations=val if one_per_conversation else None,
        messages=None,
        tokens_in_file=tokens,
        counted_with_tokenizer=tokens is not None,
        val_fraction=fraction,
        val_fraction_reason=reason,
        what_if=True,
    )


@dataclass
class Plan:
    """Everything the training loop obeys, and everything a user needs to decide whether to run.

    The type chain: RunConfig + DataSummary (+ ModelFacts) -> build_plan -> Plan -> the recipe's loop
    (reads the Plan) -> report (takes the Plan). plan.json is `to_dict()`: the data summary's fields and
    the plan's own, derived from the fields, never listed by hand.
    """

    data: DataSummary
    """The data the run trains on (its fields are top-level keys of plan.json)."""
    # ---- schedule
    epochs: int
    """Passes over the training records."""
    batch_size: int
    """Records per micro-batch on each device."""
    grad_accum: int
    """Micro-batches accumulated into one optimizer step."""
    devices: int
    """Processes training together."""
    effective_batch: int
    """batch_size x grad_accum x devices: records per optimizer step."""
    steps_per_epoch: int
    """ceil(examples / effective_batch), floor when the last partial batch is dropped."""
    total_steps: int
    """Optimizer steps the loop takes (cut to --max-steps when that is smaller)."""
    planned_steps: int
    """steps_per_epoch x epochs, before any --max-steps cut."""
    warmup_steps: int
    """Linear warmup steps: round(warmup_ratio x total_steps), or the user's --warmup-steps (capped)."""
    warmup_ratio: float
    """Warmup as a share of total_steps (given, default, or implied by --warmup-steps)."""
    last_batch: str
    """"keep" or "drop" the partial last batch of each epoch."""
    learning_rate: float
    """Peak learning rate, reached at the end of warmup."""
    schedule: str
    """Decay after warmup: "linear" or "cosine", to zero at the last step."""
    weight_decay: float
    """AdamW decoupled weight decay on matrices."""
    max_grad_norm: float | None
    """Gradient clipping norm; None: no clipping."""
    seed: int
    """Seed of the split, the shuffling, LoRA init and dropout."""
    method: str
    """"lora" or "full": the weights the run trains (for preference tuning, its --base-method)."""
    objective: str
    """"sft" (supervised: the team's answers) or "dpo" (preference: chosen over rejected answers)."""
    beta: float | None
    """DPO's beta (preference runs only)."""
    sft_weight: float | None
    """Weight of the supervised loss on chosen answers added to the DPO loss (preference runs only)."""
    lora_rank: int | None
    """None for full fine-tuning."""
    lora_alpha: float | None
    """LoRA scale numerator (alpha / rank scales the adapter); None for full fine-tuning."""
    lora_dropout: float
    """Dropout on the LoRA path."""
    lora_train_head: bool | None
    """LoRA also trains the output layer (LM head) in full; None for full fine-tuning."""
    eval_every: int
    """Validation every N optimizer steps (and at each epoch end)."""
    save_every: int
    """Checkpoint every N optimizer steps (and at the end)."""
    keep_checkpoints: int
    """Checkpoints kept besides the best."""
    gradient_checkpointing: bool
    """Recompute activations in the backward pass."""
    shard: str
    """"full" (FSDP) or "none" (one device, or DDP)."""
    dtype: str
    """Compute precision asked for: "auto" (bf16 autocast on a GPU that supports it), "fp32" or "bf16"."""
    packing: bool
    """Padding-free packing of records into rows."""
    max_seq_len: int
    """Longest record in tokens."""
    model: str | None
    """--model as given."""
    # ---- tokens
    tokens_processed: int | None
    """Tokens the run reads: tokens_in_file x epochs, cut like the steps by a dropped last batch or --max-steps."""
    tokens_exact: bool
    """False when tokens are estimated (no tokenizer, a dropped last batch, or a --max-steps cut)."""
    times_each_example_seen: float
    """Passes each record makes through the model (= epochs for a full run keeping the last batch)."""
    # ---- estimates and explanations
    memory: MemoryEstimate
    """Peak memory per device, by part (an estimate)."""
    cost: CostEstimate
    """Cost by tokens, and time and its cost (estimates)."""
    auto: dict[str, str] = field(default_factory=dict)
    """Field -> reason, for every value Auto chose."""
    warnings: list[dict] = field(default_factory=list)
    """Advice: {"code", "message"}, codes stable (docs/auto.md); set once, by build_plan."""
    chat_template: str | None = None
    """The chat template the data is rendered with: "model" (its own), "chatml", or a Jinja file's path."""
    base_origin: dict | None = None
    """The GGUF file (and its sha256) the base was converted from; None for any other base."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `finetune plan --json` and of plan.json: the data's fields, then the plan's."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "data"}
        document = dataclasses.asdict(self.data) | own
        document["dropped_lines"] = list(self.data.dropped_lines)
        document["memory"], document["cost"] = self.memory.to_dict(), self.cost.to_dict()
        document["auto"], document["warnings"] = dict(self.auto), [dict(w) for w in self.warnings]
        return document


def _number(x: float) -> float | int:
    """2.0 -> 2, 2.345 -> 2.35: integral values stay integers in the JSON."""
    x = round(x, 2)
    return int(x) if x == int(x) else x


def build_plan(
    config: RunConfig,
    data: DataSummary,
    model_facts: ModelFacts | None = None,
    step_tokens: Callable[[int, int], int] | None = None,
) -> Plan:
    """Resolve every Auto value, do the arithmetic, estimate memory and cost, and give the advice.

    `data` comes from prepare_data (`prepared.summary`) or what_if_summary. `step_tokens(effective_batch,
    steps)`, when the records are at hand (a run), gives the exact tokens of the planned steps, so a run cut by
    --max-steps or a dropped last batch plans the tokens it reads. The advice runs once, here, after the
    plan is built. Raises UserError when no step could be taken (no records, or only a partial
    batch that is dropped).
    """
    n = data.examples
    if n < 1:
        raise UserError("there are no training records, so there is nothing to train on")
    method, accum, devices = config.trained_weights, config.grad_accum, config.devices
    dpo = config.method == "dpo"
    rows_per_example = 2 if dpo else 1  # a preference pair runs its chosen and its rejected answer
    auto: dict[str, str] = {}
    if data.val_fraction_reason and config.val_fraction == AUTO and not config.val_file:
        auto["val_fraction"] = data.val_fraction_reason

    device, device_assumed, device_recognised = resolve_device(config.gpu)
    dtype = config.dtype if config.dtype != AUTO else ("fp32" if device.name == "cpu" else "bf16")
    seq_len = min(config.max_seq_len, data.max_record_tokens) if data.max_record_tokens else config.max_seq_len

    # ---- epochs and LoRA rank: from the data alone
    epochs_choice = auto_dpo_epochs(n) if dpo else auto_epochs(n, data.tokens_in_file)
    epochs = _resolve(config.epochs, epochs_choice, "epochs", auto)
    rank = alpha = train_head = None
    if method == "lora":
        rank_choice = auto_lora_rank(n, data.tokens_in_file, model_facts.lora_params(1) if model_facts else None)
        rank = _resolve(config.lora_rank, rank_choice, "lora_rank", auto)
        alpha = float(_resolve(config.lora_alpha, auto_lora_alpha(rank), "lora_alpha", auto))
        head_choice = auto_lora_train_head(
            model_facts.head_params if model_facts else None,
            model_facts.total_params if model_facts else None,
            model_facts.tie_word_embeddings if model_facts else None,
            preference=dpo,
        )
        train_head = bool(_resolve(config.lora_train_head, head_choice, "lora_train_head", auto))
        if train_head and model_facts is not None and model_facts.tie_word_embeddings:
            raise UserError(
                "--lora-train-head on: this model's output layer is tied to its input embeddings; use --lora-train-head off"
            )

    # ---- batch: Auto's effective batch, split over accumulation x devices, cut to fit the device's memory
    ckpt_possible = config.gradient_checkpointing is not False
    shard_possible = config.shard != "none" and devices > 1 and method == "full"

    def micro_batch_fits(batch: int) -> bool:
        best = estimate_memory(
            model_facts, method, batch * rows_per_example, seq_len, ckpt_possible, rank, devices,
            "full" if shard_possible else "none", device, device_assumed, dtype, bool(train_head),
        )  # fmt: skip
        return best.fits_device is not False

    can_check = model_facts is not None and device.memory_bytes is not None
    batch_choice = auto_batch_size(n, epochs, accum, devices, micro_batch_fits if can_check else None, device.name)
    batch = _resolve(config.batch_size, batch_choice, "batch_size", auto)
    effective = arithmetic.effective_batch(batch, accum, devices)
    auto_effective = arithmetic.effective_batch(batch_choice.value, accum, devices)

    # ---- steps
    per_epoch = arithmetic.steps_per_epoch(n, effective, config.last_batch)
    if per_epoch == 0:
        raise UserError(
            f"{n} training record(s) do not fill one batch of {effective} (batch {batch} x accumulation {accum} x "
            f"{devices} device(s)) and --last-batch drop discards the partial batch: no step would be taken. "
            "Use --last-batch keep or a smaller batch."
        )
    planned = arithmetic.total_steps(per_epoch, epochs)
    total = min(planned, config.max_steps) if config.max_steps else planned

    # ---- learning rate for the effective batch and the run length actually used
    hidden = model_facts.hidden_size if model_facts else None
    lr_rule = (lambda *a: auto_dpo_lr(auto_lr(*a))) if dpo else auto_lr
    lr_choice = lr_rule(method, effective, hidden, planned)
    if config.lr == AUTO:
        learning_rate = lr_choice.value
        auto["learning_rate"] = lr_choice.reason
        if effective != auto_effective:
            own_steps = arithmetic.total_steps(arithmetic.steps_per_epoch(n, auto_effective, config.last_batch), epochs)
            own = lr_rule(method, auto_effective, hidden, own_steps).value
            auto["learning_rate"] += f" (your batch size {batch}: Auto's own batch would give {own:g})"
    else:
        learning_rate = float(config.lr)

    # ---- warmup: a ratio of the run unless given in steps
    if config.warmup_steps is not None:
        warmup = min(config.warmup_steps, total)
        warmup_ratio = warmup / total
    elif config.warmup_ratio is not None:
        warmup_ratio = config.warmup_ratio
        warmup = arithmetic.warmup_steps(warmup_ratio, total)
    else:
        warmup_ratio = DEFAULT_WARMUP_RATIO
        warmup = _resolve(AUTO, auto_warmup_steps(total, warmup_ratio), "warmup_steps", auto)

    has_validation = bool(data.validation_examples) or bool(config.val_file)
    eval_every = _resolve(config.eval_every, auto_eval_every(total, has_validation), "eval_every", auto)
    save_every = _resolve(config.save_every, auto_save_every(eval_every), "save_every", auto)

    beta = float(_resolve(config.beta, auto_beta(), "beta", auto)) if dpo else None

    # ---- memory: shard first (does a full copy fit?), then gradient checkpointing under that choice
    def memory(ckpt: bool, shard: str) -> MemoryEstimate:
        return estimate_memory(
            model_facts, method, batch * rows_per_example, seq_len, ckpt, rank, devices, shard, device,
            device_assumed, dtype, bool(train_head),
        )  # fmt: skip

    if config.shard == AUTO:
        shard = _resolve(AUTO, decide_shard(method, devices, memory(ckpt_possible, "none")), "shard", auto)
    else:
        shard = config.shard if devices > 1 else "none"
    if config.gradient_checkpointing == AUTO:
        choice = decide_gradient_checkpointing(memory(False, shard), memory(True, shard))
        ckpt = bool(_resolve(AUTO, choice, "gradient_checkpointing", auto))
    else:
        ckpt = bool(config.gradient_checkpointing)
    mem = memory(ckpt, shard)

    # ---- tokens and cost
    used = arithmetic.records_used_per_epoch(n, effective, config.last_batch)
    share = (used / n) * (total / planned)  # fraction of the file x epochs that is actually read
    full_run = share == 1
    seen = _number(epochs * share)
    tokens_processed = None
    if data.tokens_in_file is not None:
        whole = arithmetic.tokens_processed(data.tokens_in_file, epochs)
        tokens_processed = whole if full_run else round(whole * share)
    tokens_exact = data.counted_with_tokenizer and full_run and data.tokens_in_file is not None
    if step_tokens is not None and not full_run:
        tokens_processed = step_tokens(effective, total)
        tokens_exact = data.counted_with_tokenizer
    cost = estimate_cost(
        tokens_processed,
        tokens_exact,
        model_facts.total_params if model_facts else None,
        method,
        device,
        device_assumed,
        devices,
        ckpt,
        config.price_per_million_tokens,
        config.gpu_hour_price,
    )

    # ---- issue 21: which chat template renders the data (and why), and the GGUF file the base came from
    template, template_reason = describe_chat_template(config.model, config.chat_template)
    if template_reason:
        auto["chat_template"] = template_reason

    plan = Plan(
        data=data,
        epochs=epochs,
        batch_size=batch,
        grad_accum=accum,
        devices=devices,
        effective_batch=effective,
        steps_per_epoch=per_epoch,
        total_steps=total,
        planned_steps=planned,
        warmup_steps=warmup,
        warmup_ratio=round(warmup_ratio, 4),
        last_batch=config.last_batch,
        learning_rate=learning_rate,
        schedule=config.schedule,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        seed=config.seed,
        method=method,
        objective="dpo" if dpo else "sft",
        beta=beta,
        sft_weight=config.sft_weight if dpo else None,
        lora_rank=rank,
        lora_alpha=alpha,
        lora_dropout=config.lora_dropout,
        lora_train_head=train_head,
        eval_every=eval_every,
        save_every=save_every,
        keep_checkpoints=config.keep_checkpoints,
        gradient_checkpointing=ckpt,
        shard=shard,
        dtype=config.dtype,
        packing=config.packing and not dpo,  # a pair's log-probabilities are read row by row (padded)
        max_seq_len=config.max_seq_len,
        model=config.model,
        tokens_processed=tokens_processed,
        tokens_exact=tokens_exact,
        times_each_example_seen=seen,
        memory=mem,
        cost=cost,
        auto=auto,
        chat_template=template,
        base_origin=origin(config.model),
    )
    context = AdviceContext(
        config=config,
        plan=plan,
        auto_epochs=epochs_choice.value,
        auto_effective_batch=auto_effective,
        auto_lr_for_batch=lr_choice.value,
        model_facts=model_facts,
        device_recognised=device_recognised,
    )
    plan.warnings = advise(context)
    return plan


def _resolve(value: Any, choice: Any, name: str, auto: dict[str, str]) -> Any:
    """The user's value, or Auto's choice (recording its reason under `name`)."""
    if value != AUTO:
        return value
    auto[name] = choice.reason
    return choice.value
