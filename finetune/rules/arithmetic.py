"""The run's arithmetic: pure integer functions, the vocabulary of every plan.

    effective batch   = per-device batch x gradient accumulation x devices
    steps per epoch   = ceil(records / effective batch)     (floor when the last partial batch is dropped)
    total steps       = steps per epoch x epochs
    warmup steps      = round(warmup ratio x total steps)
    tokens processed  = tokens in the training file x epochs

800 records, batch 8, 3 epochs -> 100 steps per epoch, 300 in total, 5% warmup = 15 steps.
"""

from __future__ import annotations

import math

from finetune.settings.errors import UserError
from finetune.settings.wording import ref


def effective_batch(batch_size: int, grad_accum: int, devices: int) -> int:
    """Records per optimizer step: per-device micro-batch x accumulation x devices."""
    for name, value in (("batch size", batch_size), ("gradient accumulation", grad_accum), ("devices", devices)):
        if value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")
    return batch_size * grad_accum * devices


def steps_per_epoch(records: int, effective: int, last_batch: str = "keep") -> int:
    """Optimizer steps in one pass: ceil(records / effective) when the partial last batch is kept, floor if dropped."""
    if records < 1:
        raise UserError("there are no training records, so there is nothing to train on")
    if effective < 1:
        raise UserError(f"the effective batch must be at least 1, got {effective}")
    if last_batch == "keep":
        return math.ceil(records / effective)
    if last_batch == "drop":
        return records // effective
    raise UserError(f"{ref('last_batch')} must be keep or drop, got {last_batch!r}")


def total_steps(per_epoch: int, epochs: int) -> int:
    """Optimizer steps of the whole run."""
    return per_epoch * epochs


def warmup_steps(ratio: float, total: int) -> int:
    """round(ratio x total steps), with Python's round (halves go to the even neighbour)."""
    if not 0 <= ratio < 1:
        raise UserError(f"the warmup ratio must be at least 0 and below 1, got {ratio}")
    return round(ratio * total)


def tokens_processed(tokens_in_file: int, epochs: int) -> int:
    """Tokens the run reads (and a per-token price bills): every training token once per epoch."""
    return tokens_in_file * epochs


def records_used_per_epoch(records: int, effective: int, last_batch: str = "keep") -> int:
    """Records that take part in one epoch: all of them, or only the full batches when the last is dropped."""
    if last_batch == "drop":
        return steps_per_epoch(records, effective, "drop") * effective
    return records


def evaluates_after(step: int, eval_every: int, steps_per_epoch: int, total_steps: int) -> bool:
    """Whether validation runs after `step` (1-based): every eval_every steps, at each epoch's end, after the last."""
    return step % eval_every == 0 or step % steps_per_epoch == 0 or step == total_steps
