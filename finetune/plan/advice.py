"""Advice on a plan: warnings with stable codes (listed in docs/auto.md), each a sentence a user can act on.

Each check is one small function of an AdviceContext returning a warning or None; `advise` runs them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from finetune.data import invented
from finetune.data.fitting import LongRecords
from finetune.data.read import duplicates_summary
from finetune.data.sensitive import sentence
from finetune.rules.auto import DEFAULT_WARMUP_RATIO, USUAL_MAX_EPOCHS
from finetune.rules.memory import gib
from finetune.rules.model_facts import ModelFacts
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.wording import ref

if TYPE_CHECKING:
    from finetune.data.types import DataSummary
    from finetune.plan.plan import Plan

SMALL_DATA_RECORDS = 1_000  # below this, more than USUAL_MAX_EPOCHS passes means compensating for little data
MIN_STEPS = 50  # fewer optimizer steps and warmup + decay have no room to work
WARMUP_LARGE_SHARE = 0.2  # a warmup given in steps that takes more than this share of the run
LR_TOLERANCE = 1.25  # a fixed --lr within this factor of Auto's rate for the batch is fine
MIN_VAL_RECORDS = 30  # fewer validation records give too noisy a validation loss to diagnose a run


@dataclass(frozen=True)
class AdviceContext:
    """What the checks look at: the plan, and what Auto would have chosen where the user chose."""

    config: RunConfig
    """The user's settings (what was left on auto)."""
    plan: Plan
    """The plan being advised on (its warnings not yet set)."""
    auto_epochs: int
    """The epochs Auto picks for this data."""
    auto_effective_batch: int
    """The effective batch Auto picks for this data (with the user's accumulation and devices)."""
    auto_lr_for_batch: float
    """Auto's learning rate for the plan's effective batch."""
    model_facts: ModelFacts | None
    device_recognised: bool
    """False when --gpu names a device the plan does not know."""

    @property
    def data(self) -> DataSummary:
        return self.plan.data


def _warning(code: str, message: str) -> dict:
    return {"code": code, "message": message}


def epochs_raised_for_small_data(ctx: AdviceContext) -> dict | None:
    p = ctx.plan
    if p.epochs <= USUAL_MAX_EPOCHS or p.data.examples >= SMALL_DATA_RECORDS:
        return None
    if ctx.config.epochs == AUTO:
        return _warning(
            "epochs_raised_for_small_data",
            f"only {p.data.examples:,} training records: Auto uses {p.epochs} epochs, one more than the usual "
            f"{USUAL_MAX_EPOCHS}, and no more, because many passes over so few examples teach those answers by "
            "heart, not the task. More data is the real fix (a few hundred records or more).",
        )
    return _warning(
        "epochs_raised_for_small_data",
        f"{p.epochs} epochs over only {p.data.examples:,} records: every example is seen {p.epochs} times, so the model "
        f"learns these {p.data.examples:,} answers by heart rather than the task. Auto would use {ctx.auto_epochs} "
        "epochs with a smaller batch; more data is the real fix.",
    )


def few_total_steps(ctx: AdviceContext) -> dict | None:
    p = ctx.plan
    if p.total_steps >= MIN_STEPS:
        return None
    message = (
        f"only {p.total_steps} optimizer steps ({p.steps_per_epoch} per epoch x {p.epochs} epochs at an effective "
        f"batch of {p.effective_batch}): too few for warmup and decay to work"
    )
    if p.total_steps < p.planned_steps:
        return _warning("few_total_steps", message + f" ({ref('max_steps', ctx.config.max_steps)} cuts the run).")
    per_step = p.grad_accum * p.devices
    enough = [
        b for b in range(p.batch_size - 1, 0, -1) if math.ceil(p.data.examples / (b * per_step)) * p.epochs >= MIN_STEPS
    ]
    if enough:
        b = enough[0]
        steps = math.ceil(p.data.examples / (b * per_step)) * p.epochs
        message += f". A batch size of {b} would give {steps} steps; more data is better still (not more epochs)."
    else:
        message += ". No batch size gives enough steps with this data: add data rather than epochs."
    return _warning("few_total_steps", message)


def warmup_steps_large_share(ctx: AdviceContext) -> dict | None:
    given, p = ctx.config.warmup_steps, ctx.plan
    if given is None or given <= WARMUP_LARGE_SHARE * p.total_steps:
        return None
    auto_steps = round(DEFAULT_WARMUP_RATIO * p.total_steps)
    if given >= p.total_steps:
        head = f"{ref('warmup_steps', given)} is as long as the whole {p.total_steps}-step run (cut to {p.warmup_steps}): the rate never decays"
    else:
        head = (
            f"{ref('warmup_steps', given)} is {given / p.total_steps:.0%} of a {p.total_steps}-step run: the learning rate "
            "spends that much of the run still climbing"
        )
    return _warning(
        "warmup_steps_large_share",
        f"{head}. Give warmup as a ratio instead ({ref('warmup_ratio')}; Auto: {DEFAULT_WARMUP_RATIO:.0%} = {auto_steps} steps).",
    )


def batch_changed_lr_not(ctx: AdviceContext) -> dict | None:
    c, p = ctx.config, ctx.plan
    if c.batch_size == AUTO or p.effective_batch == ctx.auto_effective_batch:
        return None
    if c.lr == AUTO:
        return _warning(
            "batch_changed_lr_not",
            f"you set the batch size (effective batch {p.effective_batch}; Auto's would be {ctx.auto_effective_batch}) "
            f"but not {ref('lr')}: Auto scaled the learning rate to {p.learning_rate:g} for your batch (it grows with the "
            f"square root of the batch). Give {ref('lr')} to fix it yourself.",
        )
    ratio = p.learning_rate / ctx.auto_lr_for_batch
    if 1 / LR_TOLERANCE <= ratio <= LR_TOLERANCE:
        return None
    return _warning(
        "batch_changed_lr_not",
        f"you changed the batch size (effective batch {p.effective_batch}; Auto's would be "
        f"{ctx.auto_effective_batch}) but kept {ref('lr', format(p.learning_rate, 'g'))}; for an effective batch of "
        f"{p.effective_batch} Auto would use {ctx.auto_lr_for_batch:g} (the rate grows with the square root of the batch).",
    )


def small_validation_set(ctx: AdviceContext) -> dict | None:
    val = ctx.data.validation_examples
    if val is None or val == 0 or val >= MIN_VAL_RECORDS:
        return None
    return _warning(
        "small_validation_set",
        f"only {val} validation records: the validation loss will be too noisy to tell over- from underfitting "
        f"(aim for {MIN_VAL_RECORDS}+: raise {ref('val_fraction')}, add data, or give {ref('val_file')}).",
    )


def no_validation_set(ctx: AdviceContext) -> dict | None:
    if ctx.data.validation_examples != 0 or ctx.config.val_file:
        return None
    why = ctx.data.val_fraction_reason or "no validation records"
    return _warning(
        "no_validation_set",
        f"no validation set ({why}): the run cannot show over- or underfitting; only the training loss is watched.",
    )


def val_file_emptied(ctx: AdviceContext) -> dict | None:
    """--val-file whose every conversation was removed (duplicates of training ones, or too long): validation is off."""
    if not ctx.config.val_file or ctx.data.validation_examples != 0:
        return None
    removed = ctx.data.duplicates_removed
    why = f"its {removed} conversation(s) are all in the training data too" if removed else "no record of it is usable"
    return _warning(
        "val_file_emptied",
        f"validation is off: {why} ({ctx.config.val_file}), so the run cannot show over- or underfitting; "
        f"give {ref('val_file')} with conversations that are not in the training data.",
    )


def _long_record_warning(ctx: AdviceContext, code: str) -> dict | None:
    """The warning `code` of the one summary of what the limit did to the data (data/fitting.py's words, the
    same validate prints)."""
    d = ctx.data
    summary = LongRecords(
        d.max_seq_len or 0,
        str(ctx.config.truncation),
        list(d.split_at),
        d.split_records,
        list(d.shortened_at),
        list(d.dropped_at),
        d.dropped_need_tokens,
    )
    return next((_warning(c, message) for c, message in summary.warnings() if c == code), None)


def conversations_split(ctx: AdviceContext) -> dict | None:
    """Conversations longer than max_seq_len became several records (each reply scored once)."""
    return _long_record_warning(ctx, "conversations_split")


def truncated_examples(ctx: AdviceContext) -> dict | None:
    """Records kept their replies but not all their earlier context, to fit max_seq_len."""
    return _long_record_warning(ctx, "truncated_examples")


def dropped_examples(ctx: AdviceContext) -> dict | None:
    """Records left out: a reply alone is longer than max_seq_len (or --truncation drop)."""
    return _long_record_warning(ctx, "dropped_examples")


def skipped_lines(ctx: AdviceContext) -> dict | None:
    d = ctx.data
    if not d.skipped_lines:
        return None
    where = f"{ctx.config.out}/skipped.jsonl" if ctx.config.out else "OUT/skipped.jsonl when training"
    return _warning(
        "skipped_lines",
        f"{d.skipped_lines} invalid line(s) of the data are left out ({ref('skip_invalid')}), each listed with its codes in "
        f"{where}; `finetune validate` shows them.",
    )


def duplicate_conversations(ctx: AdviceContext) -> dict | None:
    """The training file's copies of its own conversations, in the words of `finetune validate`'s summary."""
    d = ctx.data
    if not d.duplicate_conversations:
        return None
    return _warning("duplicate_conversations", duplicates_summary(d.duplicate_conversations, d.duplicate_lines) + ".")


def sensitive_data(ctx: AdviceContext) -> dict | None:
    """E-mails, phone numbers, cards, IBANs or secrets in the data (data/sensitive.py): counts, roles and lines."""
    found = ctx.data.sensitive_found
    if not found or not found["total"]:
        return None
    if found["replaced"]:
        copies = "; every copy of the data the run keeps holds the placeholders too"
        if ctx.config.test_fraction:  # the test set is scored on what the model learned to say
            copies += ", the held-out test split included"
        return _warning(
            "sensitive_data",
            f"{found['replaced']} sensitive value(s) replaced with placeholders before tokenizing "
            f"({ref('sensitive_data', 'redact')}): {sentence(found)}{copies}.",
        )
    return _warning(
        "sensitive_data",
        f"sensitive data in the data, trained on as it is: {sentence(found)}. A model learns to say what its "
        f"targets hold: {ref('sensitive_data', 'redact')} replaces each with a placeholder (<EMAIL>, <CARD>, ...), "
        f"{ref('sensitive_data', 'refuse')} stops before planning.",
    )


def invented_specifics(ctx: AdviceContext) -> dict | None:
    """Trained replies state identifiers, amounts, dates, ... their conversation never gave (data/invented.py)."""
    found = ctx.data.invented_specifics
    return _warning("invented_specifics", invented.message(found)) if invented.found_any(found) else None


def records_differ_from_conversations(ctx: AdviceContext) -> dict | None:
    p = ctx.plan
    if p.data.conversations is None or p.data.conversations == p.data.examples:
        return None
    messages = f" ({p.data.messages:,} messages)" if p.data.messages is not None else ""
    return _warning(
        "records_differ_from_conversations",
        f"{p.data.examples:,} training records come from {p.data.conversations:,} conversations{messages} "
        f"({ref('record_policy', ctx.config.record_policy)}): steps, batches and epochs count records, not conversations.",
    )


def model_size_unknown(ctx: AdviceContext) -> dict | None:
    if ctx.model_facts is not None:
        return None
    model = ctx.config.model
    what = (
        f"no {ref('model')} given"
        if not model
        else f"{model} is not a local folder or config.json and not in the built-in table of published models"
    )
    return _warning(
        "model_size_unknown",
        f"{what}: memory and training time cannot be estimated, and the learning rate is not scaled for the "
        "model's width. Name a local model folder or its config.json.",
    )


def does_not_fit_device(ctx: AdviceContext) -> dict | None:
    m, p = ctx.plan.memory, ctx.plan
    if m.fits_device is not False:
        return None
    ideas = []
    if p.method == "full":
        ideas.append(ref("method", "lora"))
    if p.batch_size > 1:
        ideas.append(f"a smaller {ref('batch_size')} with a larger {ref('grad_accum')}")
    if not p.gradient_checkpointing:
        ideas.append(ref("gradient_checkpointing", "on"))
    if p.method == "full" and p.shard != "full":
        ideas.append(f"more {ref('devices')} with {ref('shard', 'full')}")
    larger = [name for name in m.fits if name != m.device]
    if larger:
        ideas.append(f"a larger device ({', '.join(larger)})")
    return _warning(
        "does_not_fit_device",
        f"needs about {gib(m.total)} per device, more than {m.device} ({gib(m.device_bytes)})"
        + (f" (assumed: no {ref('gpu')} given)" if m.device_assumed else "")
        + (f". Try {'; or '.join(ideas)}." if ideas else "."),
    )


def max_steps_cuts_run(ctx: AdviceContext) -> dict | None:
    p = ctx.plan
    if p.total_steps >= p.planned_steps:
        return None
    return _warning(
        "max_steps_cuts_run",
        f"{ref('max_steps', ctx.config.max_steps)} cuts the planned {p.planned_steps} steps ({p.epochs} epochs) to "
        f"{p.total_steps}: records are seen about {p.times_each_example_seen} time(s), and the schedule spans "
        f"the {p.total_steps} steps.",
    )


def more_devices_than_examples(ctx: AdviceContext) -> dict | None:
    p = ctx.plan
    if p.devices <= p.data.examples:
        return None
    return _warning(
        "more_devices_than_examples",
        f"{p.devices} devices for {p.data.examples} training record(s): some devices get no record of their own in a "
        "step (they repeat others'). Use fewer devices.",
    )


def tokens_unknown(ctx: AdviceContext) -> dict | None:
    if ctx.data.tokens_in_file is not None:
        return None
    return _warning(
        "tokens_unknown",
        "tokens in the training file unknown (what-if without --tokens): no tokens processed, no cost by tokens and "
        "no time estimate. Give --tokens T.",
    )


def tokens_estimated(ctx: AdviceContext) -> dict | None:
    d = ctx.data
    if d.what_if or d.counted_with_tokenizer or d.tokens_in_file is None:
        return None
    return _warning(
        "tokens_estimated",
        f"token counts are estimated from the text length (no {ref('model')} tokenizer): give {ref('model')} for "
        "exact counts and cost.",
    )


def unknown_device(ctx: AdviceContext) -> dict | None:
    if ctx.device_recognised:
        return None
    return _warning(
        "unknown_device",
        f"{ref('gpu', ctx.config.gpu)} is not a device the plan knows; sized against {ctx.plan.memory.device} instead "
        "(known: l4-24gb, a100-40gb, a100-80gb, h100-80gb, h200-141gb, cpu).",
    )


CHECKS: tuple[Callable[[AdviceContext], dict | None], ...] = (
    skipped_lines,
    duplicate_conversations,
    sensitive_data,
    invented_specifics,
    epochs_raised_for_small_data,
    few_total_steps,
    warmup_steps_large_share,
    batch_changed_lr_not,
    small_validation_set,
    no_validation_set,
    val_file_emptied,
    conversations_split,
    truncated_examples,
    dropped_examples,
    records_differ_from_conversations,
    model_size_unknown,
    does_not_fit_device,
    max_steps_cuts_run,
    more_devices_than_examples,
    tokens_unknown,
    tokens_estimated,
    unknown_device,
)
WARNING_CODES = tuple(check.__name__ for check in CHECKS)


def advise(ctx: AdviceContext) -> list[dict]:
    """Every warning that applies to this plan, in a stable order."""
    return [w for w in (check(ctx) for check in CHECKS) if w is not None]
