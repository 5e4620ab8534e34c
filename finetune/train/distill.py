"""The divergence from the base model's own next-token distribution, summed over target tokens (soft targets).

    kl = kl_sum(model, batch)     # sum over target positions of weight x KL(base || tuned); LoRA models

At each target position t of a record, both models read the same prefix:

    KL_t(base || tuned) = sum_v p_base(v | prefix) * (log p_base(v | prefix) - log p_tuned(v | prefix))

p_base is the same LoRA model with its adapter switched off, under no_grad, on the same batch: exact, with no second
copy of the model and nothing cached. This is knowledge distillation (Hinton et al. 2015, arXiv:1503.02531) from the
starting model, as Learning without Forgetting does for old tasks (Li and Hoiem 2016, arXiv:1606.09282). Its gradient
on the tuned logits is w * (p_tuned - p_base): the cross-entropy's, with the base's whole distribution as the
target instead of one token; it is 0 while tuned = base. Like the cross-entropy (cross_entropy.py) it runs on target
positions only, chunk by chunk, its gradient computed in the forward: one chunk's [chunk, vocab] logits at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from finetune.data.types import IGNORE_INDEX
from finetune.train.batching import Batch
from finetune.train.cross_entropy import default_chunk, scored_hidden, supports_chunked_head
from finetune.train.model import output_layer_weight
from finetune.train.unwrap import causal_lm


def kl_sum(model, batch: Batch, chunk: int | None = None) -> torch.Tensor:
    """sum over the batch's target positions of weight x KL(base || tuned), the base being `model` (a PEFT model)
    with its adapter switched off (no gradient through it). A scalar, fp32 or wider."""
    if not supports_chunked_head(model):
        return reference_kl_sum(model, batch)
    with torch.no_grad(), model.disable_adapter():
        base_hidden, _, _ = scored_hidden(model, batch)
        base_weight = output_layer_weight(causal_lm(model).get_output_embeddings()).detach()
    hidden, _, weights = scored_hidden(model, batch)
    weight = output_layer_weight(causal_lm(model).get_output_embeddings())
    chunk = chunk or default_chunk(weight.shape[0])
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedLinearKL.apply(hidden, weight, base_hidden, base_weight, weights, chunk, weight.requires_grad)
    total = torch.zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        part = slice(start, start + chunk)
        kl, _, _ = _chunk_kl(hidden[part], weight, base_hidden[part], base_weight)
        total += (kl * weights[part]).sum()
    return total


def _chunk_kl(hidden, weight, base_hidden, base_weight):
    """Per position KL(base || tuned), and the tuned log-probabilities and base probabilities it came from."""
    acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 at least, fp64 when the model is fp64
    logp = torch.log_softmax((hidden @ weight.T).to(acc), dim=-1)
    logq = torch.log_softmax((base_hidden @ base_weight.T).to(acc), dim=-1)
    q = logq.exp()
    return (q * (logq - logp)).sum(-1), logp, q


class _ChunkedLinearKL(torch.autograd.Function):
    """sum_i w_i * KL(softmax(base_hidden_i @ base_weight.T) || softmax(hidden_i @ weight.T)), with the gradients
    computed chunk by chunk in forward (cross_entropy._ChunkedLinearCrossEntropy's scheme)."""

    @staticmethod
    def forward(ctx, hidden, weight, base_hidden, base_weight, token_weights, chunk: int, need_weight_grad: bool):
        acc = torch.promote_types(hidden.dtype, torch.float32)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=acc) if need_weight_grad else None
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            h, w = hidden[part], token_weights[part]
            kl, logp, q = _chunk_kl(h, weight, base_hidden[part], base_weight)
            total += (kl * w).sum()
            # d(sum w·KL(q || p))/d logits = w · (softmax(logits) − q)
            grad_logits = logp.exp_().sub_(q).to(h.dtype)
            grad_hidden[part] = (grad_logits @ weight).mul_(w[:, None])
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.T.to(acc), (h * w[:, None]).to(acc))
        ctx.save_for_backward(grad_hidden, grad_weight if grad_weight is not None else torch.empty(0))
        ctx.need_weight_grad = need_weight_grad
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        weight_grad = (grad_weight * grad_output).to(ctx.weight_dtype) if ctx.need_weight_grad else None
        return grad_hidden * grad_output, weight_grad, None, None, None, None, None


def reference_kl_sum(model, batch: Batch) -> torch.Tensor:
    """The plain path: full logits of both, then the KL. The reference the chunked path is tested against."""
    inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "attention_mask": batch.attention_mask}
    with torch.no_grad(), model.disable_adapter():
        base = model(**inputs, use_cache=False).logits
    logits = model(**inputs, use_cache=False).logits
    acc = torch.promote_types(logits.dtype, torch.float32)
    scored = batch.targets != IGNORE_INDEX
    logp, logq = (torch.log_softmax(x[scored].to(acc), dim=-1) for x in (logits, base))
    per_token = F.kl_div(logp, logq, reduction="none", log_target=True).sum(-1)
    return (per_token * batch.weights[scored]).sum()
