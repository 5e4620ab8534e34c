"""The forgetting curve on two processes (gloo, CPU): each rank scores its share of the general set and the shares
are reduced like val_loss, so two processes log what one process logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.data.prompting import stop_ids
from finetune.data.tokenize import load_tokenizer
from finetune.plan.build import build_plan
from finetune.settings.config import RunConfig
from finetune.ship.eval import general_val, replay

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DATA = str(EXAMPLES / "train.jsonl")
SHARED = ["--epochs", "1", "--max-steps", "4", "--lr", "1e-3", "--eval-every", "2", "--max-seq-len", "512"]
SHARED += ["--general-val", "on"]


@pytest.fixture
def cached_answers(toy_model, tmp_path, monkeypatch) -> None:
    """The base's answers to the held-out prompts, in a cache root of the test's own that the runs (this process and
    the two workers) read: a sentence about each prompt, closed by the stop token (the untrained toy rarely stops)."""
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    tokenizer = load_tokenizer(str(toy_model))

    def generate(model, tokenizer, prompts, max_new_tokens=96, batch_size=32):
        answers = [f"A general answer to: {p[-1]['content'][:60].lower()}" for p in prompts]
        return [[*tokenizer(a, add_special_tokens=False)["input_ids"], stop_ids(tokenizer)[0]] for a in answers]

    monkeypatch.setattr(replay, "generate_ids", generate)
    config = RunConfig(data=DATA, model=str(toy_model), general_val=True, max_seq_len=512, gpu="cpu")
    plan = build_plan(config, _summary())
    records, about = general_val.general_val_set(plan, tokenizer)
    assert len(records) == about["answers"] > 0 and about["cached"] is False


def _summary():
    from finetune.data.types import DataSummary

    return DataSummary(examples=100, validation_examples=10, conversations=100, validation_conversations=10,
                       messages=None, tokens_in_file=10_000)  # fmt: skip


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_processes_log_the_curve_one_process_logs(toy_model, tmp_path, cached_answers):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", DATA, "--model", str(toy_model), "--out", str(one), *SHARED, "--batch-size", "4",
                 "--grad-accum", "2"]) == 0  # fmt: skip
    command = [sys.executable, "-m", "finetune", "train", DATA, "--model", str(toy_model), "--out", str(two)]
    done = subprocess.run(
        [*command, *SHARED, "--devices", "2", "--batch-size", "4"], capture_output=True, text=True,
        env=dict(os.environ), timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows_one, rows_two = _rows(one), _rows(two)
    assert [r["step"] for r in rows_two if "general_val_loss" in r] == [2, 4]
    for a, b in zip(rows_two, rows_one, strict=True):
        for key in ("general_val_loss", "general_val_loss_base", "val_loss"):
            assert (key in a) == (key in b)
            if key in a:  # sharded across the ranks, reduced token-weighted: the one-process value
                assert a[key] == pytest.approx(b[key], rel=1e-5), key
    assert json.loads((two / "report.json").read_text())["forgetting"]["evaluations"] == 2
