"""RunConfig + the data's numbers + the model's numbers -> Plan: pure, no torch import.

    plan = build_plan(config, prepared.summary, load_model_facts(config.model))

`build_plan` is a list of named steps, each resolving a few settings (the user's value, or Auto's with its
reason, from auto.py) or deriving a few numbers; each step reads what the steps before it resolved. Then
the advice (advice.py) runs once on the finished plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from finetune.data.chat_template import describe_chat_template
from finetune.data.replay_mix import replay_on
from finetune.data.seq_len import model_context_length
from finetune.data.types import DataSummary
from finetune.models.source import origin
from finetune.plan.advice import AdviceContext, advise
from finetune.plan.plan import Plan
from finetune.rules import arithmetic
from finetune.rules.adapter_scale import FULL_RUN, PREFERENCE_RUN
from finetune.rules.adapter_scale import PASSES as SCALE_PASSES
from finetune.rules.adapter_scale import plan_reason as adapter_scale_reason
from finetune.rules.auto import (
    DEFAULT_WARMUP_RATIO,
    Choice,
    auto_batch_size,
    auto_epochs,
    auto_eval_every,
    auto_lora_alpha,
    auto_lora_rank,
    auto_lora_train_head,
    auto_lr,
    auto_max_seq_len,
    auto_save_every,
    auto_warmup_steps,
)
from finetune.rules.cost import estimate_cost
from finetune.rules.forgetting import auto_general_val, short_run
from finetune.rules.memory import MemoryEstimate, decide_gradient_checkpointing, decide_shard, estimate_memory
from finetune.rules.memory import resolve_device as find_device
from finetune.rules.model_facts import ModelFacts
from finetune.rules.precision import auto_dtype, device_type
from finetune.rules.preference import auto_beta, auto_dpo_epochs, auto_dpo_lr
from finetune.rules.replay import nothing_to_keep
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import UserError
from finetune.settings.version import code_version
from finetune.settings.wording import ref, render, settings_named


@dataclass(frozen=True)
class Billed:
    """A run with rows mixed in (replay): the team's training records and their tokens in the file (Auto sizes epochs
    and the batch by them, as without replay), the tokens billed in the file (the team's, and the tenant's own general
    conversations; not the rows the base model answered: rules/billing.py), and those billed of the first `steps`
    steps (`step_tokens(effective_batch, steps)`)."""

    records: int
    team_tokens: int
    tokens_in_file: int
    step_tokens: Callable[[int, int], int]


@dataclass
class _Resolving:
    """The plan while it is being built: the user's config, what is resolved so far, and Auto's reasons."""

    config: RunConfig
    data: DataSummary
    facts: ModelFacts | None
    step_tokens: Callable[[int, int], int] | None
    speed: float | None  # training tokens/s of one device, measured on this machine with this model (train/speed.py)
    billed: Billed | None = None  # replay mixed in: what the team is billed (None: every token is the team's)
    values: dict[str, Any] = field(default_factory=dict)  # setting name -> resolved value
    auto: dict[str, str] = field(default_factory=dict)  # plan.json name -> Auto's reason
    numbers: dict[str, Any] = field(default_factory=dict)  # derived numbers (Plan fields)
    auto_choices: dict[str, Any] = field(default_factory=dict)  # what Auto would pick where the user chose

    def __post_init__(self) -> None:
        self.device, self.device_assumed, self.device_recognised = find_device(self.config.gpu)
        self.dtype = "fp32"  # the run's precision: _precision resolves it first
        self.seq_len = 0  # the longest record as trained (_sequence_length)
        self.dpo = self.config.objective == "dpo"
        self.lora = self.config.trained_weights == "lora"

    def get(self, name: str) -> Any:
        return self.values.get(name, getattr(self.config, name))

    def team_data(self) -> tuple[int, int | None]:
        """(training records, tokens in the file) of the team's own data: replay rows are rehearsal, and Auto's
        passes and batch are for the team's data whether they are mixed in or not."""
        if self.billed is None:
            return self.data.examples, self.data.tokens_in_file
        return self.billed.records, self.billed.team_tokens

    def resolve(self, name: str, choice: Choice, plan_key: str | None = None) -> Any:
        """The user's value, or Auto's choice (its reason filed under the plan.json name)."""
        value = getattr(self.config, name)
        if value == AUTO:
            self.auto[plan_key or name] = choice.reason
            value = choice.value
        self.values[name] = value
        return value

    def memory(self, batch: int, ckpt: bool, shard: str) -> MemoryEstimate:
        per_example = 2 if self.dpo else 1  # a preference pair runs its chosen and its rejected answer
        rows = batch * per_example
        if self.device.name == "cpu":  # a CPU runs a micro-batch in passes of at most one packed row (pass_tokens)
            rows = min(rows, max(per_example, self.get("max_seq_len") // max(1, self.seq_len)))
        return estimate_memory(
            self.facts, self.config.trained_weights, rows, self.seq_len, ckpt, self.values.get("lora_rank"),
            self.config.devices, shard, self.device, self.device_assumed, self.dtype,
            bool(self.values.get("lora_train_head")),
        )  # fmt: skip


# ----------------------------------------------------------------------------- the steps


def _precision(r: _Resolving) -> None:
    """The run's device and precision, taken by every model the run loads (rules/precision.py); the memory
    estimate sizes the frozen base and the activations in it."""
    hidden = r.facts.hidden_size if r.facts else None
    r.dtype = r.resolve("dtype", auto_dtype(r.device.name, hidden))
    r.numbers["device"] = device_type(r.device.name)


def _base_and_chat_template(r: _Resolving) -> None:
    """Which chat template renders the data, and why; the GGUF file (and its hash) the base was converted from."""
    template, reason = describe_chat_template(r.config.model, r.config.chat_template)
    if reason:
        r.auto["chat_template"] = reason
    r.numbers |= {"chat_template": template, "base_origin": origin(r.config.model)}


def _sequence_length(r: _Resolving) -> None:
    """The limit the data path fitted the records to (Auto's choice is made there, once, from the records' whole
    lengths), or Auto's rule without data (a what-if); the longest record as trained sizes the activations."""
    if r.data.max_seq_len is not None:
        choice = Choice(r.data.max_seq_len, r.data.max_seq_len_reason or "")
    else:
        choice = auto_max_seq_len(None, model_context_length(r.config.model, r.facts))
    limit = r.resolve("max_seq_len", choice)
    longest = r.data.max_record_tokens
    r.seq_len = min(limit, longest) if longest else limit


def _epochs_and_adapter(r: _Resolving) -> None:
    """Epochs and the LoRA adapter's shape: from the data alone."""
    n, tokens = r.team_data()
    choice = auto_dpo_epochs(n) if r.dpo else auto_epochs(n, tokens)
    r.resolve("epochs", choice)
    r.auto_choices["epochs"] = choice.value
    if not r.lora:
        return
    facts = r.facts
    rank = r.resolve("lora_rank", auto_lora_rank(n, tokens, facts.lora_params(1) if facts else None))
    r.values["lora_alpha"] = float(r.resolve("lora_alpha", auto_lora_alpha(rank)))
    head = auto_lora_train_head(
        facts.head_params if facts else None,
        facts.total_params if facts else None,
        facts.tie_word_embeddings if facts else None,
        preference=r.dpo,
    )
    r.values["lora_train_head"] = train_head = bool(r.resolve("lora_train_head", head))
    if train_head and facts is not None and facts.tie_word_embeddings:
        raise UserError(
            f"{ref('lora_train_head', 'on')}: this model's output layer is tied to its input embeddings; use "
            f"{ref('lora_train_head', 'off')}"
        )


def _batch(r: _Resolving) -> None:
    """Auto's effective batch, split over accumulation x devices, cut to fit the device's memory."""
    c = r.config
    ckpt_possible = c.gradient_checkpointing is not False
    shard_possible = c.shard != "none" and c.devices > 1 and not r.lora

    def micro_batch_fits(batch: int) -> bool:
        return r.memory(batch, ckpt_possible, "full" if shard_possible else "none").fits_device is not False

    can_check = r.facts is not None and r.device.memory_bytes is not None
    choice = auto_batch_size(
        r.team_data()[0], r.values["epochs"], c.grad_accum, c.devices, micro_batch_fits if can_check else None,
        r.device.name,
    )  # fmt: skip
    batch = r.resolve("batch_size", choice)
    r.numbers["effective_batch"] = arithmetic.effective_batch(batch, c.grad_accum, c.devices)
    r.auto_choices["effective_batch"] = arithmetic.effective_batch(choice.value, c.grad_accum, c.devices)


def _steps(r: _Resolving) -> None:
    n, effective, c = r.data.examples, r.numbers["effective_batch"], r.config
    per_epoch = arithmetic.steps_per_epoch(n, effective, c.last_batch)
    if per_epoch == 0:
        raise UserError(
            f"{n} training record(s) do not fill one batch of {effective} (batch {r.values['batch_size']} x "
            f"accumulation {c.grad_accum} x {c.devices} device(s)) and {ref('last_batch', 'drop')} discards the "
            f"partial batch: no step would be taken. Use {ref('last_batch', 'keep')} or a smaller batch."
        )
    planned = arithmetic.total_steps(per_epoch, r.values["epochs"])
    total = min(planned, c.max_steps) if c.max_steps else planned
    r.numbers |= {"steps_per_epoch": per_epoch, "planned_steps": planned, "total_steps": total}


def _learning_rate(r: _Resolving) -> None:
    """For the effective batch, the model's width and the run's length; times the multiplier, if any."""
    c, n = r.config, r.data.examples
    hidden = r.facts.hidden_size if r.facts else None
    rule = (lambda *a: auto_dpo_lr(auto_lr(*a))) if r.dpo else auto_lr
    effective, auto_effective = r.numbers["effective_batch"], r.auto_choices["effective_batch"]
    choice = rule(c.trained_weights, effective, hidden, r.numbers["planned_steps"])
    r.auto_choices["lr_for_batch"] = choice.value
    lr = r.resolve("lr", choice, plan_key="learning_rate")
    if c.lr == AUTO and effective != auto_effective:
        own_steps = arithmetic.total_steps(
            arithmetic.steps_per_epoch(n, auto_effective, c.last_batch), r.values["epochs"]
        )
        own = rule(c.trained_weights, auto_effective, hidden, own_steps).value
        r.auto["learning_rate"] += f" (your batch size {r.values['batch_size']}: Auto's own batch would give {own:g})"
    if c.lr_multiplier != 1.0:  # OpenAI's learning_rate_multiplier: a factor on the rate, whoever chose it
        r.values["lr"] = lr * c.lr_multiplier
        if c.lr == AUTO:
            r.auto["learning_rate"] += f"; x {c.lr_multiplier:g}, your multiplier ({lr:g} x {c.lr_multiplier:g})"


def _warmup_and_intervals(r: _Resolving) -> None:
    c, total = r.config, r.numbers["total_steps"]
    if c.warmup_steps is not None:  # a ratio of the run unless given in steps
        warmup = min(c.warmup_steps, total)
        ratio = warmup / total
    elif c.warmup_ratio is not None:
        ratio, warmup = c.warmup_ratio, arithmetic.warmup_steps(c.warmup_ratio, total)
    else:
        ratio = DEFAULT_WARMUP_RATIO
        warmup = auto_warmup_steps(total, ratio)
        r.auto["warmup_steps"] = warmup.reason
        warmup = warmup.value
    r.values |= {"warmup_steps": warmup, "warmup_ratio": round(ratio, 4)}
    has_validation = bool(r.data.validation_examples) or bool(c.val_file)
    eval_every = r.resolve("eval_every", auto_eval_every(total, has_validation))
    r.resolve("save_every", auto_save_every(eval_every))
    if r.dpo:
        r.values["beta"] = float(r.resolve("beta", auto_beta()))


def _memory(r: _Resolving) -> None:
    """Shard first (does a full copy fit?), then gradient checkpointing under that choice."""
    c, batch = r.config, r.values["batch_size"]
    ckpt_possible = c.gradient_checkpointing is not False
    if c.shard == AUTO:
        shard = r.resolve("shard", decide_shard(c.trained_weights, c.devices, r.memory(batch, ckpt_possible, "none")))
    else:
        shard = r.values["shard"] = c.shard if c.devices > 1 else "none"
    if c.gradient_checkpointing == AUTO:
        choice = decide_gradient_checkpointing(r.memory(batch, False, shard), r.memory(batch, True, shard))
        ckpt = r.values["gradient_checkpointing"] = bool(r.resolve("gradient_checkpointing", choice))
    else:
        ckpt = bool(c.gradient_checkpointing)
    r.numbers["memory"] = r.memory(batch, ckpt, shard)


def _tokens_and_cost(r: _Resolving) -> None:
    """Tokens the run reads (exact for a run whose records are at hand), those billed, and what they cost."""
    c, data, n = r.config, r.data, r.data.examples
    effective, total, planned = r.numbers["effective_batch"], r.numbers["total_steps"], r.numbers["planned_steps"]
    epochs = r.values["epochs"]
    share = (arithmetic.records_used_per_epoch(n, effective, c.last_batch) / n) * (total / planned)
    exact = data.counted_with_tokenizer and share == 1 and data.tokens_in_file is not None
    tokens = _tokens_read(data.tokens_in_file, epochs, share, r.step_tokens, effective, total)
    billed = tokens
    if r.billed is not None:  # rows the base model answered (replay) are read, not billed
        billed = _tokens_read(r.billed.tokens_in_file, epochs, share, r.billed.step_tokens, effective, total)
    if r.step_tokens is not None and share != 1:
        exact = data.counted_with_tokenizer
    seen = round(epochs * share, 2)
    r.numbers |= {"tokens_processed": billed, "tokens_trained": tokens, "tokens_exact": exact,
                  "times_each_example_seen": _number(seen)}  # fmt: skip
    evaluations = total // r.values["eval_every"] + epochs  # every eval_every steps and at each epoch's end
    per_record = (data.tokens_in_file or 0) / n
    eval_tokens = round(evaluations * (data.validation_examples or 0) * per_record)
    r.numbers["cost"] = estimate_cost(
        billed, exact, r.facts.total_params if r.facts else None, c.trained_weights, r.device, r.device_assumed,
        c.devices, r.get("gradient_checkpointing") is True, c.price_per_million_tokens, c.gpu_hour_price,
        measured_tokens_per_s=r.speed, eval_tokens=eval_tokens, work_tokens=_work_tokens(c, tokens, billed, r.billed),
    )  # fmt: skip


def _work_tokens(config: RunConfig, tokens: int | None, billed: int | None, mix: Billed | None) -> int | None:
    """The tokens whose training the time estimate counts: soft replay targets add the base's forward pass over
    each replay row (no backward: about a third of a trained token's work)."""
    if config.replay_targets != "soft" or mix is None or tokens is None or billed is None:
        return tokens
    return tokens + round((tokens - billed) / 3)


def _tokens_read(in_file: int | None, epochs: int, share: float, step_tokens, effective: int, total: int) -> int | None:
    """in_file x epochs, cut like the steps (exact from the records when a run reads part of them)."""
    if step_tokens is not None and share != 1:
        return step_tokens(effective, total)
    if in_file is None:
        return None
    whole = arithmetic.tokens_processed(in_file, epochs)
    return whole if share == 1 else round(whole * share)


def _adapter_scale(r: _Resolving) -> None:
    """LoRA with adapter scale auto: chosen after training (ship/adapter_scale.py); the plan says how and at what
    cost (forward passes over the validation records, each token a third of a training token's work)."""
    if r.config.adapter_scale != AUTO:
        return
    if not r.lora or r.dpo:  # nothing to measure: the run says so again in its report
        r.auto["adapter_scale"] = FULL_RUN if not r.lora else PREFERENCE_RUN
        return
    small = nothing_to_keep(r.facts.total_params if r.facts else None) or short_run(r.numbers["total_steps"])
    if small is not None:
        r.values["adapter_scale"] = "off"  # the run keeps the adapter as trained and measures nothing
        r.auto["adapter_scale"] = f"off: {small}"
        return
    data, cost, processed = r.data, r.numbers["cost"], r.numbers["tokens_trained"]
    records = data.validation_examples
    tokens = round(records * (data.tokens_in_file or 0) / data.examples) if records else None
    seconds = None
    if tokens and cost.seconds is not None and processed:
        seconds = cost.seconds * (tokens * SCALE_PASSES / 3) / processed
    r.auto["adapter_scale"] = adapter_scale_reason(records, tokens, seconds)


def _general_val(r: _Resolving) -> None:
    """The forgetting curve: on or off (the run's spine measures its set once the plan is made)."""
    replay = replay_on(r.config, r.facts.total_params if r.facts else None)
    choice = auto_general_val(replay, bool(r.config.general_data), r.config.objective, r.numbers["total_steps"])
    r.values["general_val"] = bool(r.resolve("general_val", choice))


STEPS = (
    _precision,
    _base_and_chat_template,
    _sequence_length,
    _epochs_and_adapter,
    _batch,
    _steps,
    _learning_rate,
    _warmup_and_intervals,
    _memory,
    _tokens_and_cost,
    _adapter_scale,
    _general_val,
)


def build_plan(
    config: RunConfig,
    data: DataSummary,
    model_facts: ModelFacts | None = None,
    step_tokens: Callable[[int, int], int] | None = None,
    speed: float | None = None,
    billed: Billed | None = None,
) -> Plan:
    """Resolve every Auto value, do the arithmetic, estimate memory and cost, and give the advice.

    `data` comes from prepare (`prepared.summary`) or what_if_summary. `step_tokens(effective_batch, steps)`,
    when the records are at hand (a run), gives the exact tokens of the planned steps, so a run cut by
    max_steps or a dropped last batch plans the tokens it reads. `speed`: training tokens/s of one device measured
    on the machine the run will train on (train/speed.py), for the time estimate. `billed`: when rows were mixed into
    the data (replay), the team's share (which Auto sizes by) and what is billed. Raises UserError when no step
    could be taken (no records, or only a partial batch that is dropped).
    """
    if data.examples < 1:
        raise UserError("there are no training records, so there is nothing to train on")
    r = _Resolving(config, data, model_facts, step_tokens, speed, billed)
    if data.val_fraction_reason and config.val_fraction == AUTO and not config.val_file:
        r.auto["val_fraction"] = data.val_fraction_reason
    for step in STEPS:
        step(r)
    r.values["packing"] = config.packing and not r.dpo  # a pair's log-probabilities are read row by row (padded)
    plan = Plan(
        run=dataclasses.replace(config, **r.values),
        data=data,
        auto=r.auto,
        code_version=code_version(),
        model_facts=model_facts,
        **r.numbers,
    )
    advice = advise(
        AdviceContext(
            config=config,
            plan=plan,
            auto_epochs=r.auto_choices["epochs"],
            auto_effective_batch=r.auto_choices["effective_batch"],
            auto_lr_for_batch=r.auto_choices["lr_for_batch"],
            model_facts=model_facts,
            device_recognised=r.device_recognised,
        )
    )
    plan.warnings = [worded(w["code"], w["message"]) for w in advice]
    return plan


def worded(code: str, template: str) -> dict:
    """A warning as plan.json keeps it: its message for the command line, the template other readers render
    (wording.py), and the settings it names (the dashboard highlights their fields)."""
    return {"code": code, "message": render(template), "template": template, "settings": settings_named(template)}


def _number(x: float) -> float | int:
    """2.0 -> 2, 2.345 -> 2.35: integral values stay integers in the JSON."""
    x = round(x, 2)
    return int(x) if x == int(x) else x
