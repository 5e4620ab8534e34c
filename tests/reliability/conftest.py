"""Fixtures of the reliability tests (helpers are in reliability_helpers.py)."""

from __future__ import annotations

import pytest

from finetune.train.loop import build_optimizer
from finetune.train.model import add_lora, load_model


@pytest.fixture(scope="module")
def lora(toy_model):
    """(model, optimizer) after one real update, so the optimizer has moments to save."""
    model = add_lora(load_model(str(toy_model)), 4, 8, 0.0, seed=0)
    optimizer = build_optimizer(model, 1e-3, 0.0, fused=False)
    loss = sum(p.float().pow(2).sum() for p in model.parameters() if p.requires_grad)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer
