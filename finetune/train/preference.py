"""Preference tuning: the DPO objective, run by the same loop as supervised tuning (objective.py).

For a pair (chosen c, rejected r) of one prompt, with log π(y) the sum of the log-probabilities of an answer's
target tokens (masked exactly as supervised targets are):

    loss = −log σ(β · [(log π(c) − log π_ref(c)) − (log π(r) − log π_ref(r))])   (+ W × SFT loss on c)

π_ref is the starting model: for LoRA the same model with its adapter switched off (no second copy in memory);
for full tuning, log π_ref of every pair is computed once before training (`compute_reference`) and travels with
the pair. Both answers of a pair sit in the same micro-batch (rows 2i and 2i+1), and the loss is a sum over pairs
that the loop divides by the pairs of the whole effective batch: accumulation and devices give the weights of
one big batch, as for supervised tuning.

Metrics (sums over pairs; the loop divides by the pairs of the step or the validation set):
reward_margin = β·[...] above, reward_accuracy = share of pairs with a positive margin, chosen_logp and
rejected_logp = the policy's summed log-probabilities of each answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from finetune.data.preference import TokenizedPair
from finetune.data.types import IGNORE_INDEX
from finetune.report.preference import diagnose_preference, preference_summary
from finetune.train.batching import Batch, pad_batch

if TYPE_CHECKING:
    from finetune.plan.plan import Plan


@dataclass
class PairBatch(Batch):
    """A padded batch whose rows are chosen, rejected, chosen, rejected, ... (pair i = rows 2i, 2i+1)."""

    reference: torch.Tensor | None = None  # [pairs, 2] precomputed log π_ref(chosen), log π_ref(rejected)

    def to(self, device: torch.device | str) -> PairBatch:
        moved = super().to(device)
        ref = None if self.reference is None else self.reference.to(device)
        return PairBatch(**{f.name: getattr(moved, f.name) for f in dataclasses.fields(Batch)}, reference=ref)


def sequence_logps(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed log-probability of its target tokens, and how many target tokens it has."""
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits
    scored = batch.targets != IGNORE_INDEX
    rows = []
    for r in range(logits.shape[0]):  # one row's [length, vocab] log-probabilities at a time, never the batch's
        logp = torch.log_softmax(logits[r][scored[r]].to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        rows.append(logp.gather(-1, batch.targets[r][scored[r]][:, None]).sum())
    return torch.stack(rows), scored.sum(dim=1)


class DirectPreference:
    """DPO: the mean over the step's pairs of −log σ(β · margin), plus `sft_weight` × the chosen answers' NLL."""

    normaliser_name = "pairs"
    metric_names = ("reward_margin", "reward_accuracy", "chosen_logp", "rejected_logp")

    def __init__(self, beta: float, sft_weight: float = 0.0, precomputed_reference: bool = False) -> None:
        self.beta = beta
        self.sft_weight = sft_weight
        self.precomputed_reference = precomputed_reference

    def batch(self, examples: Sequence[TokenizedPair], plan: Plan | None, pad_id: int) -> PairBatch:
        rows = pad_batch([record for pair in examples for record in (pair.chosen, pair.rejected)], pad_id)
        reference = None
        if self.precomputed_reference:
            if any(pair.reference is None for pair in examples):
                raise RuntimeError("reference log-probabilities were not computed before training")
            reference = torch.tensor([pair.reference for pair in examples], dtype=torch.float64)
        return PairBatch(**{f.name: getattr(rows, f.name) for f in dataclasses.fields(Batch)}, reference=reference)

    def normaliser(self, examples: Sequence[TokenizedPair]) -> float:
        return float(len(examples))

    def before_training(self, model, examples: Sequence, device: torch.device, pad_id: int, bf16: bool) -> None:
        if self.precomputed_reference:  # full preference tuning: the starting model's log-probs, computed once
            compute_reference(model, examples, device, pad_id, bf16)

    def diagnose(self, rows: list[dict], plan) -> dict:
        return diagnose_preference(rows)

    def summary(self, rows: list[dict]) -> dict:
        return preference_summary(rows)

    def reference_logps(self, model, batch: PairBatch) -> torch.Tensor:
        if batch.reference is not None:
            return batch.reference.flatten()
        # LoRA: the starting model is the same weights with the adapter switched off
        with torch.no_grad(), model.disable_adapter():
            return sequence_logps(model, batch)[0]

    def loss(self, model, batch: PairBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        policy, targets = sequence_logps(model, batch)
        reference = self.reference_logps(model, batch).to(policy.dtype)
        chosen, rejected = policy[0::2], policy[1::2]
        margin = self.beta * ((chosen - reference[0::2]) - (rejected - reference[1::2]))
        loss = -F.logsigmoid(margin).sum()
        if self.sft_weight:
            loss = loss + self.sft_weight * (-chosen / targets[0::2].clamp(min=1)).sum()
        margin = margin.detach()
        metrics = {
            "reward_margin": margin.sum(),
            "reward_accuracy": (margin > 0).to(margin.dtype).sum(),
            "chosen_logp": chosen.detach().sum(),
            "rejected_logp": rejected.detach().sum(),
        }
        return loss, metrics


@torch.no_grad()
def compute_reference(
    model, pairs: Sequence[TokenizedPair], device: torch.device, pad_id: int, bf16: bool = False, batch_pairs: int = 8
) -> None:
    """Fill `pair.reference` with the starting model's log-probabilities (full tuning: no frozen copy kept).

    Under the precision the loop trains in (`bf16`: the same autocast), so that at step 0 the policy's
    log-probabilities equal the reference's and every margin starts at zero, as with LoRA's adapter switched off.
    Dropout is off here; the loop trains with the model's own dropout (zero in the models this tool targets).
    """
    was_training = model.training
    model.eval()
    model.to(device)
    probe = DirectPreference(beta=1.0)
    for start in range(0, len(pairs), batch_pairs):
        group = list(pairs[start : start + batch_pairs])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logps = sequence_logps(model, probe.batch(group, None, pad_id).to(device))[0].double().cpu()
        for i, pair in enumerate(group):
            pair.reference = (float(logps[2 * i]), float(logps[2 * i + 1]))
    model.train(was_training)
