"""A small LoRA run shared by the export, chat, serving and eval tests (toy model, a few steps), and a full run."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune.cli import main

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
# a high learning rate so that a few steps move the adapter far enough to change greedy answers
FEW_STEPS = ["--epochs", "1", "--batch-size", "8", "--max-seq-len", "512", "--lr", "0.01", "--max-steps", "6"]


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
