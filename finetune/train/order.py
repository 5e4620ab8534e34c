"""Which records make each optimizer step, and how a step is cut into micro-batches and passes. No torch.

The rule: the records of an optimizer step depend only on (seed, epoch, effective batch). How the
step is then split across devices and accumulation micro-batches is a separate, later decision,
so changing batch × accumulation × devices (with the same product) never changes what is learned.
"""

from __future__ import annotations

import random

from finetune.rules.memory import activation_bytes_per_token


def epoch_order(num_records: int, seed: int, epoch: int) -> list[int]:
    """A fresh permutation of the records for every epoch (0-based), from the seed alone."""
    order = list(range(num_records))
    random.Random(f"finetune-epoch-{seed}-{epoch}").shuffle(order)
    return order


def epoch_steps(num_records: int, effective_batch: int, seed: int, epoch: int, last_batch: str) -> list[list[int]]:
    """The record indices of each optimizer step of one epoch."""
    order = epoch_order(num_records, seed, epoch)
    steps = [order[i : i + effective_batch] for i in range(0, num_records, effective_batch)]
    if last_batch == "drop" and steps and len(steps[-1]) < effective_batch:
        steps.pop()
    return steps


class StepSchedule:
    """The record indices of optimizer step k (0-based), for steps taken in order: one epoch's order at a time."""

    def __init__(self, num_records: int, effective_batch: int, seed: int, last_batch: str, steps_per_epoch: int):
        self.num_records, self.effective_batch, self.seed = num_records, effective_batch, seed
        self.last_batch, self.steps_per_epoch = last_batch, steps_per_epoch
        self._epoch, self._steps = -1, []

    def examples(self, step_index: int) -> list[int]:
        epoch, within = divmod(step_index, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._steps = epoch_steps(self.num_records, self.effective_batch, self.seed, epoch, self.last_batch)
        return self._steps[within]


def schedule_tokens(lengths: list[int], effective_batch: int, seed: int, last_batch: str, steps: int) -> int:
    """Tokens read by the first `steps` optimizer steps (every epoch's order computed once)."""
    total, epoch = 0, 0
    while steps > 0:
        for step in epoch_steps(len(lengths), effective_batch, seed, epoch, last_batch)[:steps]:
            total += sum(lengths[i] for i in step)
            steps -= 1
        epoch += 1
    return total


def micro_batches(
    step_records: list[int], lengths: list[int], devices: int, grad_accum: int, rank: int
) -> list[list[int]]:
    """The micro-batches (record indices) that `rank` runs for one optimizer step.

    Records are sorted by length and cut into devices × grad_accum consecutive groups, so each
    micro-batch holds records of similar length (little waste when padding or packing). Group j goes
    to rank j % devices. A partial last step can leave a rank with fewer, or empty, micro-batches.
    """
    ordered = sorted(step_records, key=lambda i: (-lengths[i], i))
    groups = devices * grad_accum
    size = -(-len(ordered) // groups)  # ceil: at most batch_size records per micro-batch
    chunks = [ordered[j * size : (j + 1) * size] for j in range(groups)]
    return [chunk for j, chunk in enumerate(chunks) if j % devices == rank and chunk]


def passes(micro: list[int], lengths: list[int], max_tokens: int | None) -> list[list[int]]:
    """A micro-batch cut into forward/backward passes of at most `max_tokens` tokens: whole records, in order
    (a longer record is a pass of its own). None: the micro-batch is one pass.

    A micro-batch's loss is a sum over its records (objective.py), so running it in passes changes no gradient,
    only how many activations are held at once.
    """
    if max_tokens is None:
        return [micro]
    cut: list[list[int]] = []
    tokens = 0
    for index in micro:
        if cut and tokens + lengths[index] <= max_tokens:
            cut[-1].append(index)
            tokens += lengths[index]
        else:
            cut.append([index])
            tokens = lengths[index]
    return cut


PASS_ACTIVATION_BYTES = 2**30  # a pass may hold this much of the memory estimate's activations (or one row)


def pass_tokens(plan, device_type: str) -> int | None:
    """Tokens per forward/backward pass: on a CPU at most 1 GiB of estimated activations but at least one packed
    row (max_seq_len); on a GPU the whole micro-batch.

    A CPU gains no speed from a longer pass of a real model, only memory: SmolLM2 LoRA on 2 cores, 16 records in
    passes of 1, 2, 4 and 8 records, took 34.0, 34.8, 34.9 and 33.6 s and peaked at 3.9, 5.4, 8.7 and 12.8 GB
    (docs/arithmetic.md). A tiny model pays a fixed cost per pass instead (the toy demo trained in 19-21 s whole,
    32-38 s in rows), and its activations are small: its micro-batches stay whole. A GPU runs a longer pass faster.
    """
    if device_type != "cpu":
        return None
    if plan.model_facts is None:
        return plan.max_seq_len
    per_token = activation_bytes_per_token(plan.model_facts, plan.run.lora_rank if plan.method == "lora" else None)
    return max(plan.max_seq_len, PASS_ACTIVATION_BYTES // max(1, per_token))
