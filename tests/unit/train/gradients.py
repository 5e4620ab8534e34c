"""Gradient comparison helpers shared by the loss and packed-attention tests."""

from __future__ import annotations

import torch


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Equal up to float rounding: every element within 1e-5 of the tensor's largest entry."""
    assert got.keys() == expected.keys()
    for name, grad in got.items():
        scale = float(expected[name].abs().max())
        assert torch.allclose(grad, expected[name], rtol=1e-4, atol=1e-5 * scale), name
