"""Chunked linear cross-entropy: weighted NLL summed over target tokens only, never the full logits.

The LM head and the cross-entropy run on target positions only, in chunks, inside one autograd
function that computes the gradient while it computes the loss. Peak memory for logits is one chunk
(chunk x vocabulary), never batch x length x vocabulary, and no logits are kept for the backward.

Why not a library kernel: Liger's fused linear cross-entropy and Apple's cut-cross-entropy do the same
job on CUDA (Triton) only; this run must also train on the CPU (tests, the demo, gloo runs) with the
same numbers, and take a per-token weight (a reply scaled by its `weight`) in the sum, which neither
takes. The sum (not the mean) is what the loop needs: callers divide by the step's global normaliser
(objective.py), which makes splitting a step into micro-batches or devices exact. On a GPU this kernel
is two matmuls per chunk; whether a Triton kernel beats it is a question for bench/throughput.py.

Packed batches run through variable-length attention when the model has it (attention.py): the
filler that makes packed rows rectangular is dropped and the records go through the model as one row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from finetune.data.types import IGNORE_INDEX
from finetune.train.attention import uses_varlen_attention
from finetune.train.batching import Batch
from finetune.train.model import output_layer_weight
from finetune.train.unwrap import causal_lm

LOGITS_BUDGET_BYTES = 256 * 2**20  # per LM-head chunk: logits and log-probabilities, fp32 (~1000 rows at 32k vocab)


def default_chunk(vocab_size: int) -> int:
    """Target positions per LM-head chunk, so that a chunk's two [chunk, vocab] fp32 buffers fit the budget."""
    return max(64, LOGITS_BUDGET_BYTES // (2 * 4 * max(1, vocab_size)))


def supports_chunked_head(model) -> bool:
    """The fused path reproduces `logits = lm_head(hidden)`; models that post-process logits use the plain path."""
    lm = causal_lm(model)
    if hasattr(lm.get_output_embeddings(), "lora_A"):  # a LoRA on the head itself: only its forward applies it
        return False
    config = lm.config
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
            rows = torch.arange(t.shape[0], device=t.device)
            # one fused pass over the [chunk, vocab] logits (log_softmax), one more for the softmax (exp_)
            logp = torch.log_softmax((h @ weight.T).to(acc), dim=-1)
            total -= (logp[rows, t] * w).sum()
            # d(sum w·nll)/d logits = w · (softmax − one_hot): w scales the small [chunk, hidden] side instead
            grad_logits = logp.exp_()
            grad_logits[rows, t] -= 1.0
            grad_logits = grad_logits.to(h.dtype)
            grad_hidden[start : start + chunk] = (grad_logits @ weight).mul_(w[:, None])
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


def nll_sum(model, batch: Batch, chunk: int | None = None) -> torch.Tensor:
    """Weighted NLL summed over the batch's target tokens (a scalar, fp32 or wider)."""
    if not supports_chunked_head(model):
        return reference_nll_sum(model, batch)
    hidden, targets, weights = scored_hidden(model, batch)
    weight = output_layer_weight(causal_lm(model).get_output_embeddings())
    chunk = chunk or default_chunk(weight.shape[0])
    return _chunked_nll_sum(hidden, weight, targets, weights, chunk)


def scored_hidden(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decoder's last hidden states at the batch's target positions, with those targets and their weights:
    what the output layer turns into the scored logits (packed records run as one row when the model can)."""
    lm = causal_lm(model)
    inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "attention_mask": batch.attention_mask}
    targets, weights = batch.targets, batch.weights
    if batch.flat_index is not None and uses_varlen_attention(model):
        # the records end to end in one row, without filler; the attention reads their boundaries
        flat = lambda t: t.reshape(-1).index_select(0, batch.flat_index)[None]  # noqa: E731
        inputs = {"input_ids": flat(batch.input_ids), "position_ids": flat(batch.position_ids)}
        inputs |= {"cu_seq_lens_q": batch.cu_seq_lens, "cu_seq_lens_k": batch.cu_seq_lens}
        inputs |= {"max_length_q": batch.max_record_len, "max_length_k": batch.max_record_len}
        targets, weights = flat(targets), flat(weights)
    out = lm.get_decoder()(**inputs, use_cache=False)
    scored = targets != IGNORE_INDEX
    return out.last_hidden_state[scored], targets[scored], weights[scored]


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
