"""The loss: weighted negative log-likelihood summed over target tokens only.

The LM head and the cross-entropy run on target positions only, in chunks, inside one autograd
function that computes the gradient while it computes the loss. Peak memory for logits is one chunk
(chunk × vocabulary), never batch × length × vocabulary, and no logits are kept for the backward.

Callers divide by the number of target tokens of the whole effective batch (see loop.py): the sum is
what makes splitting a step into micro-batches or devices exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from finetune.data.types import IGNORE_INDEX
from finetune.train.batching import Batch

DEFAULT_CHUNK = 1024  # target positions per LM-head chunk: 1024 × 150k vocab × 4 bytes ≈ 600 MB at most


def causal_lm(model):
    """The transformers CausalLM inside a (possibly PEFT- or DDP-wrapped) model."""
    while hasattr(model, "module"):  # DDP / compiled wrappers
        model = model.module
    if hasattr(model, "get_base_model"):  # PEFT: LoRA layers are injected into this model
        model = model.get_base_model()
    return model


def supports_chunked_head(model) -> bool:
    """The fused path reproduces `logits = lm_head(hidden)`; models that post-process logits use the plain path."""
    config = causal_lm(model).config
    return not getattr(config, "final_logit_softcapping", None) and getattr(config, "logit_scale", None) in (None, 1)


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * CE(hidden_i @ weight.T, target_i), with gradients computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, token_weights, chunk: int, need_weight_grad: bool):
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 at least, fp64 when the model is fp64
        total = torch.zeros((), dtype=acc, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=acc) if need_weight_grad else None
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start : start + chunk]
            t = targets[start : start + chunk]
            w = token_weights[start : start + chunk]
            logits = (h @ weight.T).to(acc)
            lse = torch.logsumexp(logits, dim=-1)
            nll = lse - logits.gather(1, t[:, None]).squeeze(1)
            total += (nll * w).sum()
            # d(sum w·nll)/d logits = w · (softmax − one_hot), built in place over the logits
            probs = logits.sub_(lse[:, None]).exp_()
            probs[torch.arange(t.shape[0], device=t.device), t] -= 1.0
            grad_logits = probs.mul_(w[:, None]).to(h.dtype)
            grad_hidden[start : start + chunk] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.T.to(acc), h.to(acc))
        ctx.save_for_backward(grad_hidden, grad_weight if grad_weight is not None else torch.empty(0))
        ctx.need_weight_grad = need_weight_grad
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        weight_grad = (grad_weight * grad_output).to(ctx.weight_dtype) if ctx.need_weight_grad else None
        return grad_hidden * grad_output, weight_grad, None, None, None, None


def _chunked_nll_sum(hidden, weight, targets, token_weights, chunk: int) -> torch.Tensor:
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, token_weights, chunk, weight.requires_grad)
    acc = torch.promote_types(hidden.dtype, torch.float32)
    total = torch.zeros((), dtype=acc, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        logits = (hidden[start : start + chunk] @ weight.T).to(acc)
        nll = F.cross_entropy(logits, targets[start : start + chunk], reduction="none")
        total += (nll * token_weights[start : start + chunk]).sum()
    return total


def nll_sum(model, batch: Batch, chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Weighted NLL summed over the batch's target tokens (a scalar, fp32 or wider)."""
    lm = causal_lm(model)
    if not supports_chunked_head(model):
        return reference_nll_sum(model, batch)
    out = lm.get_decoder()(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        attention_mask=batch.attention_mask,
        use_cache=False,
    )
    scored = batch.targets != IGNORE_INDEX
    hidden = out.last_hidden_state[scored]
    head = lm.get_output_embeddings()
    return _chunked_nll_sum(hidden, head.weight, batch.targets[scored], batch.weights[scored], chunk)


def reference_nll_sum(model, batch: Batch) -> torch.Tensor:
    """The plain path: full logits, then cross-entropy. The reference the fused path is tested against."""
    logits = model(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        attention_mask=batch.attention_mask,
        use_cache=False,
    ).logits
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    nll = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
    return (nll * batch.weights.flatten()).sum()
