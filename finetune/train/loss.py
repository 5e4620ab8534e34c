"""The loss: weighted negative log-likelihood summed over target tokens only.

The LM head and the cross-entropy run on target positions only, in chunks, inside one autograd
function that computes the gradient while it computes the loss. Peak memory for logits is one chunk
(chunk × vocabulary), never batch × length × vocabulary, and no logits are kept for the backward.

Callers divide by the number of target tokens of the whole effective batch (see loop.py): the sum is
what makes splitting a step into micro-batches or devices exact.

Packed batches run through variable-length attention when the model has it (FlashAttention 2/3, or
`use_varlen_attention(model)`, an SDPA run record by record): the filler that makes packed rows
rectangular is dropped and the records go through the model as one row, so every position computed
is a token of real data, and attention costs the sum of the records' squared lengths instead of the
square of each row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from finetune.data.types import IGNORE_INDEX
from finetune.train.batching import Batch

LOGITS_BUDGET_BYTES = 256 * 2**20  # per LM-head chunk: logits and log-probabilities, fp32 (~1000 rows at 32k vocab)
VARLEN_ATTENTION = "finetune_varlen_sdpa"
VARLEN_CAPABLE = {VARLEN_ATTENTION, "flash_attention_2", "flash_attention_3"}


def default_chunk(vocab_size: int) -> int:
    """Target positions per LM-head chunk, so that a chunk's two [chunk, vocab] fp32 buffers fit the budget."""
    return max(64, LOGITS_BUDGET_BYTES // (2 * 4 * max(1, vocab_size)))


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
    lm = causal_lm(model)
    if not supports_chunked_head(model):
        return reference_nll_sum(model, batch)
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
    hidden = out.last_hidden_state[scored]
    head = lm.get_output_embeddings()
    chunk = chunk or default_chunk(head.weight.shape[0])
    return _chunked_nll_sum(hidden, head.weight, targets[scored], weights[scored], chunk)


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


# ---------------------------------------------------------------------------- variable-length attention on SDPA


def _segments_from_positions(position_ids: torch.Tensor | None) -> torch.Tensor | None:
    """Record boundaries of packed rows ([rows, length], positions restarting at 0), in flattened order."""
    if position_ids is None:
        return None
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().flatten()
    end = torch.tensor([flat.numel()], device=flat.device)
    return torch.cat([starts, end]).to(torch.int32)


def varlen_sdpa_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs
):
    """SDPA run record by record over packed rows: causal inside each record, nothing across records.

    Costs the sum of the records' squared lengths (SDPA's block-diagonal mask costs each row's square)
    and needs no mask at all. Record boundaries come from `cu_seq_lens_q` (what nll_sum passes, the
    same argument FlashAttention's varlen path reads) or else from position ids restarting at 0.
    Anything else (a padding mask, a KV cache, decoding) is plain SDPA.
    """
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None and attention_mask is None and query.shape[2] > 1 and query.shape[2] == key.shape[2]:
        bounds = _segments_from_positions(kwargs.get("position_ids"))
    if bounds is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    rows, heads, length, dim = query.shape
    groups = heads // key.shape[1]
    if groups > 1:  # grouped-query attention: share each key/value head with its query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    # [rows, heads, length, dim] -> [1, heads, rows·length, dim]: the rows end to end, as the bounds count them
    flat = lambda t: t.transpose(0, 1).reshape(1, heads, rows * length, dim) if rows > 1 else t  # noqa: E731
    q, k, v = flat(query), flat(key), flat(value)
    edges = bounds.tolist()
    parts = [
        F.scaled_dot_product_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], dropout_p=dropout, is_causal=True, scale=scaling
        )
        for a, b in zip(edges[:-1], edges[1:], strict=True)
        if b > a
    ]
    out = torch.cat(parts, dim=2)  # [1, heads, rows·length, dim]
    out = out.view(heads, rows, length, dim).permute(1, 2, 0, 3) if rows > 1 else out.transpose(1, 2)
    return out, None  # [rows, length, heads, dim], like the other attention functions


def _varlen_mask(*args, attention_mask=None, **kwargs):
    """No mask to build when nothing is padded and there is no cache: the attention knows the records."""
    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    offsets = kwargs.get("q_offset", 0) or kwargs.get("kv_offset", 0)
    if attention_mask is None and q_length == kv_length and not offsets and kwargs.get("local_size") is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


AttentionInterface.register(VARLEN_ATTENTION, varlen_sdpa_attention)
AttentionMaskInterface.register(VARLEN_ATTENTION, _varlen_mask)


def _full_causal_attention(config) -> bool:
    """Every layer attends to the whole causal prefix: no sliding window, no soft-capping (conservative)."""
    if getattr(config, "attn_logit_softcapping", None):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(config, "use_sliding_window", None) is False or getattr(config, "sliding_window", None) is None


def use_varlen_attention(model) -> bool:
    """Switch a model on SDPA to `varlen_sdpa_attention`; True when packed batches now skip filler and masks.

    Only plain causal decoders are switched (see _full_causal_attention); FlashAttention models already
    have a varlen path and are left as they are. Outside packed batches the function is plain SDPA.
    """
    lm = causal_lm(model)
    if lm.config._attn_implementation in VARLEN_CAPABLE:
        return True
    if lm.config._attn_implementation != "sdpa" or not _full_causal_attention(lm.config):
        return False
    lm.set_attn_implementation(VARLEN_ATTENTION)
    return True


def uses_varlen_attention(model) -> bool:
    return causal_lm(model).config._attn_implementation in VARLEN_CAPABLE
