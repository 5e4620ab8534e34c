"""The loss equals the reference formula, and the fused chunked path equals the plain one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gradients import assert_same_gradients, grads

from finetune.train.batching import pack_batch, pad_batch
from finetune.train.cross_entropy import nll_sum, reference_nll_sum
from finetune.train.model import load_model


def test_loss_equals_hand_computed_formula(toy_model, records):
    """-(1/N) Σ w·log p(token | prefix), computed by hand from full logits, one record at a time."""
    model = load_model(str(toy_model))
    batch_records = records[:5]
    expected_sum, n_targets = 0.0, 0
    for r in batch_records:
        logits = model(input_ids=torch.tensor([r.input_ids])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        for i in range(1, len(r)):
            if r.labels[i] != -100:
                expected_sum += -r.weights[i] * float(logp[i - 1, r.input_ids[i]])
                n_targets += 1
    batch = pack_batch(batch_records, 128, pad_id=0)
    assert batch.num_targets == n_targets
    got = float(nll_sum(model, batch)) / batch.num_targets
    assert abs(got - expected_sum / n_targets) < 1e-5


def test_chunked_head_matches_plain_path_loss_and_gradients(toy_model, records):
    model = load_model(str(toy_model))
    batch = pad_batch(records[:8], pad_id=0)
    reference = reference_nll_sum(model, batch)
    reference.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    fused = nll_sum(model, batch, chunk=7)  # several chunks, the last one partial
    fused.backward()
    assert torch.allclose(fused, reference, rtol=1e-5)
    assert_same_gradients(grads(model), expected)


def test_packing_matches_padding(toy_model, records):
    """Packed rows (position ids restarting, no mask) give the padded path's loss and gradients."""
    model = load_model(str(toy_model))
    padded = nll_sum(model, pad_batch(records, pad_id=0))
    padded.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    packed_batch = pack_batch(records, 64, pad_id=0)
    assert packed_batch.input_ids.shape[0] < len(records)  # really packed several records per row
    packed = nll_sum(model, packed_batch)
    packed.backward()
    assert torch.allclose(packed, padded, rtol=1e-5)
    assert_same_gradients(grads(model), expected)


def test_masked_tokens_have_no_influence(toy_model, records):
    """Changing context tokens after the last target, or the label of masked positions, changes nothing;
    and the gradient of the logits at context positions is exactly zero."""
    model = load_model(str(toy_model))
    batch = pad_batch(records[:4], pad_id=0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits.retain_grad()
    nll = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=-100, reduction="none")
    (nll * batch.weights.flatten()).sum().backward()
    context = (batch.targets == -100).unsqueeze(-1).expand_as(logits)
    assert torch.count_nonzero(logits.grad[context]) == 0
    assert torch.count_nonzero(logits.grad[~context]) > 0


def test_a_head_trained_beside_the_adapter_is_the_one_the_fused_path_uses(toy_model, records):
    """LoRA with the output layer trained (modules_to_save): the fused path equals the plain one, with the
    adapter on (the trained copy) and off (the original head: a DPO reference must not see the trained one)."""
    from finetune.train.model import add_lora

    model = add_lora(load_model(str(toy_model)), rank=4, alpha=8.0, dropout=0.0, seed=0, train_head=True)
    with torch.no_grad():
        trained = model.get_base_model().get_output_embeddings().weight  # the copy the optimizer moves
        trained.add_(0.1 * torch.randn(trained.shape, generator=torch.Generator().manual_seed(0)))
    batch = pad_batch(records[:8], pad_id=0)
    on = reference_nll_sum(model, batch)
    assert torch.allclose(nll_sum(model, batch, chunk=7), on, rtol=1e-5)
    with model.disable_adapter():
        off = reference_nll_sum(model, batch)
        assert torch.allclose(nll_sum(model, batch, chunk=7), off, rtol=1e-5)
    assert not torch.allclose(on, off, rtol=1e-3)
    reference = load_model(str(toy_model))  # the base model: what "adapter off" must equal
    assert torch.allclose(off, reference_nll_sum(reference, batch), rtol=1e-5)
