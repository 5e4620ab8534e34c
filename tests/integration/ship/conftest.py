"""A small LoRA run shared by the export, chat, serving and eval tests (toy model, a few steps), and a full run."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune.commands.cli import main

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# a high learning rate so that a few steps move the adapter far enough to change greedy answers
FEW_STEPS = ["--epochs", "1", "--batch-size", "8", "--max-seq-len", "512", "--lr", "0.01", "--max-steps", "6"]
FEW_STEPS += ["--dtype", "fp32"]  # export's equivalences (merged = adapter on base) are checked in fp32


@pytest.fixture(scope="session")
def lora_run(toy_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ship") / "run"
    args = ["train", str(EXAMPLES / "train.jsonl"), "--model", str(toy_model), "--out", str(out), *FEW_STEPS]
    assert main([*args, "--eval-every", "3", "--keep-checkpoints", "2", "--test-fraction", "0.1"]) == 0
    return out


@pytest.fixture(scope="session")
def full_run(toy_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    args = ["train", str(EXAMPLES / "train.jsonl"), "--model", str(toy_model), "--out", str(out), "--method", "full"]
    assert main([*args, "--batch-size", "8", "--max-seq-len", "512", "--max-steps", "2", "--val-fraction", "0"]) == 0
    return out


@pytest.fixture(scope="session", params=["qwen2", "qwen3"])
def qwen_lora_run(request, tmp_path_factory) -> Path:
    """A Qwen toy (tied output layer; Qwen2: q/k/v biases; Qwen3: q/k norms) and two LoRA steps on it."""
    from finetune.ship.toy import ToySize, build_toy_model

    root = tmp_path_factory.mktemp(request.param)
    size = ToySize(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)
    base = build_toy_model(root / "base", data=EXAMPLES / "train.jsonl", size=size, architecture=request.param)
    out = root / "run"
    args = ["train", str(EXAMPLES / "train.jsonl"), "--model", str(base), "--out", str(out), "--max-steps", "2"]
    assert main([*args, "--batch-size", "8", "--max-seq-len", "512", "--lr", "0.01", "--val-fraction", "0"]) == 0
    return out
