"""Variable-length attention on SDPA: packed records attend within themselves, with no filler and no mask.

Packed batches run through variable-length attention when the model has it (FlashAttention 2/3, or
`use_varlen_attention(model)`, which switches an SDPA model to `varlen_sdpa_attention`): the filler
that makes packed rows rectangular is dropped and the records go through the model as one row, so every
position computed is a token of real data, and attention costs the sum of the records' squared lengths
instead of the square of each row.

Why not a library kernel: FlashAttention's varlen path is what this mirrors, and a model loaded with
`attn_implementation="flash_attention_2"` uses it unchanged (VARLEN_CAPABLE); but flash-attn is a CUDA
build that is not installed here and does not run on the CPU. transformers' flex attention compiles a
block mask per batch (torch.compile; slow to start, and every packed batch has another shape), and SDPA
with a block-diagonal mask computes every row's full square. A loop of SDPA calls, one per record,
runs on every device with exact causal attention and needs no mask at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from finetune.train.unwrap import causal_lm

VARLEN_ATTENTION = "finetune_varlen_sdpa"
VARLEN_CAPABLE = {VARLEN_ATTENTION, "flash_attention_2", "flash_attention_3"}


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
    # [rows, heads, length, dim] -> [1, heads, rows·length, dim]: the rows end to end, as the bounds count them
    flat = lambda t: t.transpose(0, 1).reshape(1, t.shape[1], rows * length, dim) if rows > 1 else t  # noqa: E731
    edges = bounds.tolist()
    sizes = [b - a for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]
    # split (not slices): its backward is one concatenation, where each slice's backward fills a zero tensor of
    # the whole row; enable_gqa shares key/value heads without the copies repeat_interleave makes
    parts = [
        F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=key.shape[1] != heads
        )
        for q, k, v in zip(
            flat(query).split(sizes, dim=2), flat(key).split(sizes, dim=2), flat(value).split(sizes, dim=2), strict=True
        )
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
