"""Auto: the documented rules (docs/auto.md) that pick hyperparameters from the data, each with its reason.

Every rule is a small pure function returning `Choice(value, reason)`. The thresholds below are the
whole policy; docs/auto.md explains each one and compares it with OpenAI's, Tinker's and LLaMA-Factory's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from finetune.settings.wording import ref

T = TypeVar("T")

# ---- epochs: 3 is the SFT default; tiny sets get one more pass, large ones fewer (never more for more data)
EPOCHS_BY_RECORDS = ((100, 4), (5_000, 3), (20_000, 2))  # (records below, epochs); 1 from 20,000 records
EPOCHS_BY_TOKENS = ((100_000_000, 1), (20_000_000, 2))  # (tokens from, at most epochs): very large sets need fewer
USUAL_MAX_EPOCHS = 3

# ---- batch: effective batch from data size, halved until the run has enough steps for its schedule
BATCH_BY_RECORDS = ((1_000, 8), (10_000, 16))  # (records below, effective batch); 32 from 10,000 records
MAX_EFFECTIVE_BATCH = 32
MIN_EFFECTIVE_BATCH = 4
TARGET_STEPS = 100  # Auto shrinks the batch (never raises epochs) until the run has this many steps

# ---- learning rate: by method, scaled with sqrt(effective batch) and 1 / model width (muP's rule for Adam)
LORA_LR, FULL_LR = 2e-4, 2e-5  # at the reference batch and width; LoRA takes ~10x the full fine-tuning rate
REFERENCE_BATCH = 16
REFERENCE_WIDTH = 4096  # hidden size of Llama-3.1-8B / Mistral-7B, where those rates are common practice
BATCH_FACTOR_RANGE = (0.25, 4.0)
WIDTH_FACTOR_RANGE = (0.5, 32.0)
# Full fine-tuning scales with 1 / width (muP); LoRA with 1 / width^1.5. On SmolLM2-135M (width 576; bench/AUTO.md)
# the best full rate was where 1 / width puts it, the best LoRA rate ~3x above it; 1.5 also meets Tinker's calibrated
# LoRA rates for Llama-3.2-1B and 3.1-8B (docs/auto.md). Narrower than ~400, LoRA reaches the cap (the toy base).
WIDTH_EXPONENT = {"lora": 1.5, "full": 1.0}
# A run with fewer than TARGET_STEPS steps (tiny data, even at the smallest batch) takes larger steps: x sqrt(100/steps),
# at most 2. On the toy base, 40 conversations (40 steps): best val loss 1.77 at Auto's old 3.2e-3, 1.36 at 5.1e-3.
MAX_SHORT_RUN_FACTOR = 2.0

# ---- LoRA rank from the training tokens of one epoch
RANK_BY_TOKENS = ((2_000_000, 8), (20_000_000, 16), (100_000_000, 32))  # (tokens below, rank); 64 above
MAX_AUTO_RANK = 64
# A small model's adapter has few weights per rank: the rank doubles until the adapter holds this many weights
# per token of an epoch (what rank 8 holds on an 8B model at 2M tokens, where the table starts to raise it).
ADAPTER_WEIGHTS_PER_TOKEN = 10
TOKENS_PER_RECORD_GUESS = 500
# A small model's output layer is a large share of it (21% on the toy base, 2-7% on 7-8B models): LoRA also trains
# it from this share on (on the toy base: best validation loss 1.97 with the adapter alone, 0.26 with the head).
HEAD_SHARE_TRAINED = 0.10  # used when the token count is unknown (what-if without --tokens)

# ---- max sequence length: every record whole when the model and the memory allow it, else a high percentile
NO_DATA_MAX_SEQ_LEN = 1024  # a what-if plan has no records to measure
LONG_RECORD_PERCENTILE = 99  # when the longest record cannot train whole: the longer 1% are split, not all of them

# ---- warmup and evaluation
DEFAULT_WARMUP_RATIO = 0.05
EVALUATIONS_PER_RUN = 10


@dataclass(frozen=True)
class Choice(Generic[T]):
    """A value Auto chose and the sentence that says why."""

    value: T
    """The chosen value."""
    reason: str
    """Why, in words a user can check against the data."""


def _first(table: tuple[tuple[int, int], ...], x: int, above: int) -> int:
    for limit, value in table:
        if x < limit:
            return value
    return above


def auto_epochs(records: int, tokens: int | None = None) -> Choice[int]:
    """Passes over the data: 4 under 100 records, 3 up to 5,000, 2 up to 20,000, then 1 (fewer for many tokens)."""
    by_records = _first(EPOCHS_BY_RECORDS, records, 1)
    epochs = by_records
    reason = f"{records:,} training records: "
    if by_records > USUAL_MAX_EPOCHS:
        reason += (
            f"a small set gets one pass more than the usual {USUAL_MAX_EPOCHS}, and no more "
            "(more passes would teach these answers by heart, not the task)"
        )
    elif by_records == USUAL_MAX_EPOCHS:
        reason += f"the usual {USUAL_MAX_EPOCHS} passes for supervised fine-tuning of a set this size"
    else:
        reason += f"a large set needs fewer passes ({by_records}) to learn the task without memorising it"
    if tokens is not None:
        by_tokens = next((cap for limit, cap in EPOCHS_BY_TOKENS if tokens >= limit), epochs)
        if by_tokens < epochs:
            epochs = by_tokens
            reason = f"{tokens:,} tokens per epoch: a set this large needs only {epochs} pass(es)"
    return Choice(epochs, reason)


def auto_effective_batch(records: int, epochs: int) -> Choice[int]:
    """Target records per optimizer step: 8 / 16 / 32 by data size, halved (down to 4) until the run has
    TARGET_STEPS steps, and never more than the records themselves."""
    target = _first(BATCH_BY_RECORDS, records, MAX_EFFECTIVE_BATCH)
    reason = f"{records:,} records: effective batch {target}"
    start = target
    while target > MIN_EFFECTIVE_BATCH and math.ceil(records / target) * epochs < TARGET_STEPS:
        target //= 2
    if target < start:
        steps = math.ceil(records / target) * epochs
        reason += (
            f", halved to {target} so the run has {steps} steps (aim: {TARGET_STEPS}+) for warmup and decay "
            "(a smaller batch, not more epochs)"
        )
    if target > records:
        target = records
        reason = f"only {records} record(s): one batch holds them all"
    return Choice(max(1, target), reason)


def auto_batch_size(
    records: int,
    epochs: int,
    grad_accum: int,
    devices: int,
    fits: Callable[[int], bool] | None = None,
    device_name: str | None = None,
) -> Choice[int]:
    """Per-device micro-batch: Auto's effective batch divided by accumulation x devices, then halved while
    `fits(micro_batch)` says the memory estimate does not fit the device."""
    target = auto_effective_batch(records, epochs)
    per_step = grad_accum * devices
    batch = max(1, target.value // per_step)
    reason = target.reason
    if per_step > 1:
        reason += f"; {target.value} / ({grad_accum} accumulation x {devices} device(s)) = {batch} per device"
        if batch * per_step != target.value:
            reason += f" (effective {batch * per_step})"
    if fits is not None and not fits(batch):
        if not fits(1):  # the model itself does not fit: a smaller batch would not help (see the memory warning)
            return Choice(batch, reason + f"; does not fit {device_name or 'the device'} even at 1 per device")
        start = batch
        while batch > 1 and not fits(batch):
            batch //= 2
        if batch < start:
            reason += (
                f"; cut to {batch} per device to fit {device_name or 'the device'} "
                f"(raise {ref('grad_accum')} to {math.ceil(target.value / (batch * devices))} to keep the effective batch)"
            )
    return Choice(batch, reason)


def _round_lr(lr: float) -> float:
    """Two significant digits: 2.83e-4 -> 2.8e-4 (a plan reads better, and nothing is that precise)."""
    return float(f"{lr:.2g}")


def _clamp(x: float, bounds: tuple[float, float]) -> float:
    return min(bounds[1], max(bounds[0], x))


def auto_lr(method: str, effective: int, hidden_size: int | None = None, steps: int | None = None) -> Choice[float]:
    """Peak learning rate: 2e-4 (LoRA) or 2e-5 (full) at effective batch 16 and width 4096, times
    sqrt(effective / 16) and (4096 / hidden size)^1.5 for LoRA, ^1 for full (both clamped), and sqrt(100 / steps) (at most 2) for a run
    shorter than TARGET_STEPS."""
    base = LORA_LR if method == "lora" else FULL_LR
    batch_factor = _clamp(math.sqrt(effective / REFERENCE_BATCH), BATCH_FACTOR_RANGE)
    lr = base * batch_factor
    reason = (
        f"{'LoRA' if method == 'lora' else 'full fine-tuning'} base {base:g} "
        f"({'10x the full-fine-tuning rate' if method == 'lora' else 'a tenth of the LoRA rate'}) "
        f"x sqrt({effective}/{REFERENCE_BATCH}) for the effective batch"
    )
    if hidden_size:
        exponent = WIDTH_EXPONENT["lora" if method == "lora" else "full"]
        width_factor = _clamp((REFERENCE_WIDTH / hidden_size) ** exponent, WIDTH_FACTOR_RANGE)
        lr *= width_factor
        power = "" if exponent == 1 else f"^{exponent:g}"
        reason += (
            f" x {width_factor:.2f} for the model width {hidden_size} "
            f"(({REFERENCE_WIDTH}/{hidden_size}){power}, at most {WIDTH_FACTOR_RANGE[1]:g}: narrower models take "
            f"larger steps, as muP scales Adam's rate{'; LoRA more steeply' if power else ''})"
        )
    else:
        reason += " (model width unknown: no width scaling)"
    if steps and steps < TARGET_STEPS:
        short_factor = min(MAX_SHORT_RUN_FACTOR, math.sqrt(TARGET_STEPS / steps))
        lr *= short_factor
        reason += (
            f" x {short_factor:.2f} for a short run ({steps} steps, under Auto's {TARGET_STEPS}: "
            f"sqrt({TARGET_STEPS}/{steps}), at most {MAX_SHORT_RUN_FACTOR:g}, so few steps still move the weights far enough)"
        )
    return Choice(_round_lr(lr), reason)


def estimated_tokens(records: int, tokens: int | None) -> tuple[int, bool]:
    """Training tokens of one epoch, or a guess from the record count; second value True when guessed."""
    if tokens is not None:
        return tokens, False
    return records * TOKENS_PER_RECORD_GUESS, True


def auto_lora_rank(records: int, tokens: int | None, weights_per_rank: int | None = None) -> Choice[int]:
    """LoRA rank grows with the training tokens: 8 below 2M, 16 below 20M, 32 below 100M, else 64; and doubles
    (up to 64) while the adapter holds fewer than 10 weights per token of an epoch (small models)."""
    count, guessed = estimated_tokens(records, tokens)
    rank = _first(RANK_BY_TOKENS, count, MAX_AUTO_RANK)
    what = (
        f"about {count:,} tokens (guessed at {TOKENS_PER_RECORD_GUESS} per record)" if guessed else f"{count:,} tokens"
    )
    by_tokens = rank
    if weights_per_rank:
        while rank < MAX_AUTO_RANK and rank * weights_per_rank < ADAPTER_WEIGHTS_PER_TOKEN * count:
            rank *= 2
    if rank == by_tokens:
        return Choice(rank, f"{what} per epoch: rank {rank} has room for what this much data can teach")
    return Choice(
        rank,
        f"{what} per epoch, and this model's adapter holds {weights_per_rank:,} weights per rank: rank {rank} "
        + (
            f"(not {by_tokens}) gives it at least {ADAPTER_WEIGHTS_PER_TOKEN} weights per token"
            if rank * weights_per_rank >= ADAPTER_WEIGHTS_PER_TOKEN * count
            else f"(not {by_tokens}), the most Auto picks, comes closest to {ADAPTER_WEIGHTS_PER_TOKEN} weights per token"
        ),
    )


def auto_lora_alpha(rank: int) -> Choice[float]:
    """alpha = 2 x rank, so the adapter's scale alpha/rank stays 2 whatever the rank."""
    return Choice(
        float(2 * rank), f"2 x rank {rank}: the adapter's scale (alpha / rank = 2) stays the same at any rank"
    )


def auto_lora_train_head(
    head_weights: int | None, model_weights: int | None, tied: bool | None, preference: bool = False
) -> Choice[bool]:
    """Train the output layer (LM head) in full beside the adapter when it is at least a tenth of the model's
    weights (a small model); never when it is tied to the input embeddings, nor for preference tuning."""
    if preference:
        return Choice(False, "preference tuning trains the adapter only")
    if head_weights is None or not model_weights:
        return Choice(False, "model shape unknown: the adapter only, as LoRA usually trains")
    if tied:
        return Choice(False, "the output layer shares its weights with the input embeddings: the adapter only")
    share = head_weights / model_weights
    if share < HEAD_SHARE_TRAINED:
        return Choice(
            False, f"the output layer is {share:.0%} of the model's weights: the adapter only, as LoRA usually trains"
        )
    return Choice(
        True,
        f"the output layer is {share:.0%} of the model's weights ({head_weights:,}; 2-7% on 7-8B models): a small "
        "model, where a LoRA on the blocks alone cannot reshape which tokens it predicts, so it is trained too",
    )


def auto_warmup_steps(total: int, ratio: float = DEFAULT_WARMUP_RATIO) -> Choice[int]:
    """Warmup as a share of the run, never a fixed count: round(ratio x total)."""
    steps = round(ratio * total)
    return Choice(steps, f"{ratio:.0%} of {total} steps (a ratio, so short and long runs warm up alike)")


def auto_eval_every(total: int, has_validation: bool) -> Choice[int]:
    """About EVALUATIONS_PER_RUN evaluations per run, at least every step for very short runs."""
    every = max(1, math.ceil(total / EVALUATIONS_PER_RUN))
    count = total // every
    if has_validation:
        return Choice(
            every, f"about {EVALUATIONS_PER_RUN} evaluations per run ({count} over {total} steps, plus each epoch end)"
        )
    return Choice(every, f"no validation set: only sets the checkpoint rhythm ({count} over {total} steps)")


def auto_save_every(eval_every: int) -> Choice[int]:
    """Checkpoint at every evaluation, so the best step by validation loss is always on disk."""
    return Choice(eval_every, "at every evaluation, so the best checkpoint by validation loss is kept")


def _largest_fitting(fits: Callable[[int], bool], high: int) -> int:
    """The largest length in [1, high] that `fits` (which is monotone); fits(1) must hold."""
    low = 1
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def data_max_seq_len(limit: int | None, reason: str | None, context_length: int | None = None) -> Choice[int]:
    """The limit the data path fitted the records to (with Auto's reason), or the what-if rule when no data was
    read (`limit` None)."""
    if limit is None:
        return auto_max_seq_len(None, context_length)
    return Choice(limit, reason or "")


def auto_max_seq_len(
    lengths: Sequence[int] | None,
    context_length: int | None = None,
    fits: Callable[[int], bool] | None = None,
    device_name: str | None = None,
) -> Choice[int]:
    """Longest record in tokens: the longest record of the data (`lengths`, ascending) when it is within the
    model's context window and one micro-batch of one such record fits the device (`fits`, None: not checked);
    otherwise the 99th percentile of the lengths, at most what the window and the memory allow. Without data,
    1,024 (at most the window)."""
    window = f"the model's {context_length:,}-token context window" if context_length else None
    if lengths is None or not len(lengths):
        value = min(NO_DATA_MAX_SEQ_LEN, context_length or NO_DATA_MAX_SEQ_LEN)
        return Choice(
            value, f"no data to measure: {value:,} tokens" + (f" ({window})" if value < NO_DATA_MAX_SEQ_LEN else "")
        )
    longest = int(lengths[-1])
    device = device_name or "the device"
    if fits is not None and not fits(1):
        fits = None  # the model alone does not fit: the length is not what to change (the memory warning says so)
    within = [window] if window else []
    if fits is not None:
        within.append(f"{device}'s memory at one record per micro-batch")
    over_window = context_length is not None and longest > context_length
    if not over_window and (fits is None or fits(longest)):
        checked = f", within {' and '.join(within)}" if within else ""
        return Choice(longest, f"the longest record is {longest:,} tokens{checked}: every record trains whole")
    percentile = int(lengths[min(len(lengths) - 1, math.ceil(LONG_RECORD_PERCENTILE / 100 * len(lengths)) - 1)])
    value, limits = percentile, []
    if over_window:
        value = min(value, context_length)
        limits.append(f"over {window}")
    if fits is not None:
        high = min(longest, context_length or longest)
        room = _largest_fitting(fits, high)
        if room < high:
            value = min(value, room)
            limits.append(f"more than {device}'s memory holds in one micro-batch (at most {room:,} tokens)")
    return Choice(
        value,
        f"the longest record ({longest:,} tokens) is {' and '.join(limits)}: the {LONG_RECORD_PERCENTILE}th percentile "
        f"of record lengths{', capped' if value < percentile else ''}, {value:,} tokens; longer records are split",
    )
