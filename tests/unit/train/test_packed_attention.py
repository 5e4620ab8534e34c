"""Variable-length attention on packed batches: one flat row, no filler, no mask, same loss and gradients."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from gradients import assert_same_gradients, grads

from finetune.train.attention import (
    VARLEN_ATTENTION,
    _full_causal_attention,
    use_varlen_attention,
    uses_varlen_attention,
)
from finetune.train.batching import pack_batch, pad_batch
from finetune.train.cross_entropy import default_chunk, nll_sum, reference_nll_sum
from finetune.train.model import add_lora, enable_gradient_checkpointing, load_model


def _loss_and_grads(model, loss_fn, batch):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, batch)
    loss.backward()
    return float(loss.detach()), grads(model)


def test_flat_row_is_the_records_end_to_end(records):
    batch = pack_batch(records, 64, pad_id=0)
    flat_ids = batch.input_ids.reshape(-1)[batch.flat_index].tolist()
    assert batch.num_tokens == len(flat_ids) < batch.input_ids.numel()  # filler exists and is dropped
    starts = batch.cu_seq_lens.tolist()
    pieces = [flat_ids[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert sorted(pieces) == sorted(r.input_ids for r in records)
    assert batch.max_record_len == max(len(r) for r in records)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_varlen_packing_matches_padding(toy_model, records, method):
    model = load_model(str(toy_model))
    if method == "lora":
        model = add_lora(model, 8, 16, 0.0, seed=0)
    padded_loss, expected = _loss_and_grads(model, nll_sum, pad_batch(records, pad_id=0))
    assert use_varlen_attention(model) and uses_varlen_attention(model)
    packed = pack_batch(records, 64, pad_id=0)
    for loss_fn in (nll_sum, reference_nll_sum):  # flat row with cu_seq_lens; rectangular rows, bounds from positions
        loss, grads = _loss_and_grads(model, loss_fn, packed)
        assert loss == pytest.approx(padded_loss, rel=1e-5)
        assert_same_gradients(grads, expected)
    # the padded path on the switched model is plain SDPA with its padding mask
    loss, grads = _loss_and_grads(model, nll_sum, pad_batch(records, pad_id=0))
    assert loss == pytest.approx(padded_loss, rel=1e-6)
    assert_same_gradients(grads, expected)


def test_varlen_with_gradient_checkpointing(toy_model, records):
    """Recomputed layers see the same record boundaries as the first forward."""
    model = add_lora(load_model(str(toy_model)), 8, 16, 0.0, seed=0)
    padded_loss, expected = _loss_and_grads(model, nll_sum, pad_batch(records, pad_id=0))
    use_varlen_attention(model)
    enable_gradient_checkpointing(model)
    loss, grads = _loss_and_grads(model, nll_sum, pack_batch(records, 64, pad_id=0))
    assert loss == pytest.approx(padded_loss, rel=1e-5)
    assert_same_gradients(grads, expected)


def test_generation_is_unchanged_by_the_switch(toy_model):
    model = load_model(str(toy_model)).eval()
    prompt = torch.tensor([[5, 17, 33, 8, 91, 12]])
    before = model.generate(prompt, max_new_tokens=6, do_sample=False)
    use_varlen_attention(model)
    assert model.config._attn_implementation == VARLEN_ATTENTION
    assert torch.equal(model.generate(prompt, max_new_tokens=6, do_sample=False), before)


def test_only_plain_causal_models_are_switched():
    assert _full_causal_attention(SimpleNamespace(sliding_window=None))
    assert _full_causal_attention(SimpleNamespace(sliding_window=4096, use_sliding_window=False))
    assert not _full_causal_attention(SimpleNamespace(sliding_window=4096))
    assert not _full_causal_attention(SimpleNamespace(layer_types=["full_attention", "sliding_attention"]))
    assert not _full_causal_attention(SimpleNamespace(sliding_window=None, attn_logit_softcapping=50.0))


def test_logits_chunk_follows_the_vocabulary():
    assert default_chunk(32768) == 1024
    assert 200 < default_chunk(151936) < 256  # two [chunk, vocab] fp32 buffers stay within 256 MiB
