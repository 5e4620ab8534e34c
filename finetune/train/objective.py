"""The objective: what one optimizer step minimises. The training loop (recipe.py) takes it as a parameter.

An objective is three plain methods; the loop, checkpoints, resume, evaluation and the distributed code
are shared by every objective:

    batch(examples, plan, pad_id) -> Batch        the tensors of one micro-batch of examples
    normaliser(examples) -> float                 the step's denominator, counted over a whole step
    loss(model, batch) -> (loss_sum, metric_sums) a SUM over the micro-batch, not a mean

The loop divides each micro-batch's `loss_sum` by the normaliser of the whole effective batch (every
micro-batch of every rank; every rank computes it from the step's examples without communicating),
so splitting a step into micro-batches or devices never changes the gradient. `metric_sums` are summed
the same way and divided by the same normaliser, then logged under their names in metrics.jsonl.
Validation is sum(loss_sum) / sum(normaliser) over the validation set.

Examples are whatever the objective trains on; the loop needs only `len(example)` (tokens read, for
balancing micro-batches and counting tokens). SFT trains on TokenizedRecord.

Preference tuning (DPO) fits the same interface:
- examples are pairs (chosen and rejected record of one prompt); `batch` puts both sides of every pair
  in the same micro-batch (e.g. rows 2i and 2i+1), so a pair is never split across micro-batches or ranks;
- `loss` sums per-sequence log-probabilities over target tokens of each side, runs the reference model
  under `torch.no_grad()` (for LoRA, the same model with `model.disable_adapter()`; for full tuning a frozen
  copy the objective holds), and returns sum over pairs of -logsigmoid(beta * margin) plus metric sums
  such as {"reward_margin": ..., "reward_accuracy": ...};
- `normaliser` is the number of pairs, so the loss is a mean over the pairs of the effective batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from finetune.data.types import TokenizedRecord
from finetune.train.batching import Batch, pack_batch, pad_batch
from finetune.train.cross_entropy import nll_sum

if TYPE_CHECKING:
    from finetune.plan.plan import Plan


class Objective(Protocol):
    normaliser_name: str
    """The metrics.jsonl key of a step's normaliser (e.g. target_tokens, pairs)."""

    def batch(self, examples: Sequence, plan: Plan, pad_id: int) -> Batch: ...

    def normaliser(self, examples: Sequence) -> float: ...

    def loss(self, model, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


class TokenNormalisedSFT:
    """Supervised fine-tuning: weighted NLL of the target tokens, a mean over every target token of the step.

    Averaging per micro-batch and then averaging the averages is the classic bug this avoids: a test
    checks batch 4 x accumulation 2 gives the weights of batch 8 x accumulation 1.
    """

    normaliser_name = "target_tokens"

    def batch(self, examples: Sequence[TokenizedRecord], plan: Plan, pad_id: int) -> Batch:
        if plan.packing:
            return pack_batch(list(examples), plan.max_seq_len, pad_id)
        return pad_batch(list(examples), pad_id)

    def normaliser(self, examples: Sequence[TokenizedRecord]) -> float:
        return sum(r.num_targets for r in examples)

    def loss(self, model, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return nll_sum(model, batch), {}
