"""Nested training state as safetensors + JSON: what goes in comes back, bit for bit and type for type."""

from __future__ import annotations

import math

import pytest
import torch

from finetune.train.state_files import StateFileError, check_state_files, read_state_files, write_state


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_an_fsdp_optimizer_state_and_every_rank_s_rng_come_back(tmp_path):
    weight = torch.randn(3, 4)
    view = torch.arange(8.0)[2:6]  # a view of a larger tensor: stored as its own values
    state = {
        # keyed by parameter name (a sharded run's full state) or by index (one process): both kept as they are
        "state": {"model.layers.0.weight": {"step": torch.tensor(7.0), "exp_avg": weight, "exp_avg_sq": weight * 2},
                  3: {"step": torch.tensor(7.0), "exp_avg": view, "exp_avg_sq": torch.zeros(0, dtype=torch.bfloat16)}},
        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
                          "foreach": None, "max_grad_norm": float("nan"), "limit": float("inf"),
                          "params": ["model.layers.0.weight", 3]}],
    }  # fmt: skip
    rng = {"torch": torch.get_rng_state(), "python": [3, list(range(625)), None]}
    write_state(tmp_path, "optimizer", state)
    write_state(tmp_path, "rng", {**rng, "ranks": [rng, rng]})
    check_state_files(tmp_path, "optimizer")
    assert _same(read_state_files(tmp_path, "optimizer"), state)
    assert _same(read_state_files(tmp_path, "rng"), {**rng, "ranks": [rng, rng]})


def test_what_is_not_state_is_refused_when_written_and_when_read(tmp_path):
    with pytest.raises(TypeError):
        write_state(tmp_path, "x", {"obj": object()})
    write_state(tmp_path, "x", {"a": torch.ones(2)})
    (tmp_path / "x.json").write_text('{"format": 1, "state": {"dict": [["a", {"tensor": "t7"}]]}}')
    with pytest.raises(StateFileError, match="does not describe"):
        check_state_files(tmp_path, "x")
    (tmp_path / "x.safetensors").write_bytes(b"\x80\x04not safetensors")
    with pytest.raises(StateFileError, match="not a readable safetensors file"):
        read_state_files(tmp_path, "x")
