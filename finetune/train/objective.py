"""The objective: what one optimizer step minimises. The training loop (loop.py) takes it as a parameter.

An objective is a few plain methods (the `Objective` protocol); the loop, checkpoints, resume, evaluation and
the distributed code are shared by every objective:

    batch(examples, plan, pad_id) -> Batch        the tensors of one micro-batch of examples
    normaliser(examples) -> float                 the step's denominator, counted over a whole step
    loss(model, batch) -> (loss_sum, metric_sums) a SUM over the micro-batch, not a mean
    metric_names                                  the keys of metric_sums (every rank logs the same numbers)
    before_training(model, examples, ...)         e.g. DPO of every weight: the starting model's log-probs
    diagnose(rows, plan), summary(rows)           what the report says of the run

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from finetune.data.types import TokenizedRecord
from finetune.report.diagnosis import diagnose
from finetune.train.batching import Batch, pack_batch, pad_batch
from finetune.train.cross_entropy import nll_sum
from finetune.train.distill import kl_sum
from finetune.train.preference import DirectPreference

if TYPE_CHECKING:
    from finetune.plan.plan import Plan


class Objective(Protocol):
    """What the loop, the set-up and the report need of an objective; nothing else is asked of it."""

    normaliser_name: str
    """The metrics.jsonl key of a step's normaliser (e.g. target_tokens, pairs)."""
    metric_names: tuple[str, ...]
    """The objective's own metrics (keys of `loss`'s metric sums), logged per step and as val_<name>."""

    def batch(self, examples: Sequence, plan: Plan, pad_id: int) -> Batch: ...

    def normaliser(self, examples: Sequence) -> float: ...

    def loss(self, model, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...

    def before_training(self, model, examples: Sequence, device: torch.device, pad_id: int, bf16: bool) -> None:
        """Anything to compute on the starting model before the first step (DPO of every weight: the reference)."""

    def diagnose(self, rows: list[dict], plan: Plan) -> dict:
        """The report's diagnosis of the run from its metrics rows."""

    def summary(self, rows: list[dict]) -> dict:
        """The objective's own numbers for report.json."""


class TokenNormalisedSFT:
    """Supervised fine-tuning: weighted NLL of the target tokens, a mean over every target token of the step.

    Averaging per micro-batch and then averaging the averages is the classic bug this avoids: a test
    checks batch 4 x accumulation 2 gives the weights of batch 8 x accumulation 1.
    """

    normaliser_name = "target_tokens"
    metric_names: tuple[str, ...] = ()

    def batch(self, examples: Sequence[TokenizedRecord], plan: Plan, pad_id: int) -> Batch:
        if plan.packing:
            return pack_batch(list(examples), plan.max_seq_len, pad_id)
        return pad_batch(list(examples), pad_id)

    def normaliser(self, examples: Sequence[TokenizedRecord]) -> float:
        return sum(r.num_targets for r in examples)

    def loss(self, model, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return nll_sum(model, batch), {}

    def before_training(self, model, examples: Sequence, device: torch.device, pad_id: int, bf16: bool) -> None:
        pass

    def diagnose(self, rows: list[dict], plan: Plan) -> dict:
        return diagnose(rows, plan.steps_per_epoch)

    def summary(self, rows: list[dict]) -> dict:
        return {}


@dataclass
class SplitBatch:
    """One micro-batch as two: the team's records (`text`) and the replay rows (`soft`), either may be None."""

    text: Batch | None
    soft: Batch | None

    def to(self, device: torch.device | str) -> SplitBatch:
        return SplitBatch(*(None if b is None else b.to(device) for b in (self.text, self.soft)))

    @property
    def num_tokens(self) -> int:
        return sum(b.num_tokens for b in (self.text, self.soft) if b is not None)


class SoftReplaySFT(TokenNormalisedSFT):
    """Supervised tuning with soft targets on the replay rows (`replay_targets: soft`; docs/retention.md).

    The records after the team's `team_rows` lines of the mixed training file are the base model's own answers:
    there each target token costs KL(base || tuned) over the whole vocabulary (distill.py) instead of the NLL of the
    base's greedy token; the team's records keep the weighted NLL. Both are sums over target tokens and the loop
    divides them by the step's target tokens of every record, so the loss stays the mean over every target token of
    the effective batch (accumulation, devices and resume as for TokenNormalisedSFT). Only training uses the
    divergence: evaluation runs the model in eval mode (validation, the forgetting curve, the adapter scale) and
    scores every record's NLL, so those numbers mean what they always meant.
    """

    def __init__(self, team_rows: int) -> None:
        self.team_rows = team_rows

    def batch(self, examples: Sequence[TokenizedRecord], plan: Plan, pad_id: int) -> SplitBatch:
        text = [r for r in examples if r.line <= self.team_rows]
        soft = [r for r in examples if r.line > self.team_rows]
        make = super().batch
        return SplitBatch(make(text, plan, pad_id) if text else None, make(soft, plan, pad_id) if soft else None)

    def loss(self, model, batch: SplitBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total = nll_sum(model, batch.text) if batch.text is not None else None
        if batch.soft is not None:
            soft = kl_sum(model, batch.soft) if model.training else nll_sum(model, batch.soft)
            total = soft if total is None else total + soft
        return total, {}


def objective_for(plan: Plan) -> Objective:
    """The objective a plan trains with: supervised (with soft targets on replay rows when the plan asks for them
    and mixed some in), or preference tuning (DPO) with the plan's beta."""
    if plan.objective == "dpo":
        return DirectPreference(plan.beta or 0.1, plan.sft_weight or 0.0, precomputed_reference=plan.method == "full")
    added = plan.replay_added or {}
    if plan.replay_targets == "soft" and added.get("rows"):
        return SoftReplaySFT(int(added["team_rows"]))
    return TokenNormalisedSFT()
