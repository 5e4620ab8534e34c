"""`finetune train PREFS --method dpo` on the bundled preference set: the toy model learns the team's preference.

The held-out check uses prompts of examples/test.jsonl, which the preference set never saw: after tuning,
the house-style answer gains on the generic one compared with the starting model (the reward accuracy of
held-out pairs), far above chance (0.5).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from finetune.cli import main
from finetune.config import RunConfig
from finetune.data.preference import prepare_pairs
from finetune.data.tokenize import load_tokenizer
from finetune.train.preference import DirectPreference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PAIRS = 64


def _generator():
    spec = importlib.util.spec_from_file_location("generate_prefs", EXAMPLES / "generate_prefs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _held_out_pairs(tmp_path: Path, toy_model: Path):
    conversations = [json.loads(line) for line in (EXAMPLES / "test.jsonl").read_text().splitlines() if line.strip()]
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in _generator().pairs(conversations[:24])))
    config = RunConfig(data=str(path), model=str(toy_model), method="dpo", val_fraction=0, max_seq_len=512)
    return prepare_pairs(config, load_tokenizer(str(toy_model))).train


def test_dpo_teaches_the_preferred_style(toy_model, tmp_path):
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join((EXAMPLES / "prefs.jsonl").read_text().splitlines(keepends=True)[:PAIRS]))
    out = tmp_path / "run"
    flags = ["--method", "dpo", "--epochs", "1", "--batch-size", "8", "--lr", "2e-3", "--val-fraction", "0.25"]
    assert main(["train", str(data), "--model", str(toy_model), "--out", str(out), "--eval-every", "3", *flags]) == 0

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"reward_margin", "reward_accuracy", "chosen_logp", "rejected_logp", "pairs"} <= set(rows[0])
    assert rows[0]["reward_accuracy"] == 0  # the adapter starts at zero: policy = reference, every pair a tie
    evaluated = [r for r in rows if "val_reward_accuracy" in r]
    assert evaluated[-1]["val_reward_accuracy"] >= 0.9 and evaluated[-1]["val_reward_margin"] > 0
    report = json.loads((out / "report.json").read_text())
    assert report["diagnosis"]["kind"] == "healthy_preference" and report["objective"] == "dpo"
    assert report["final_val_reward_accuracy"] == evaluated[-1]["val_reward_accuracy"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["objective"] == "dpo" and plan["method"] == "lora" and plan["beta"] == 0.1 and "beta" in plan["auto"]
    assert (out / "loss_curve.png").stat().st_size > 0 and (out / "adapter").is_dir()

    # held-out prompts: the tuned model moved toward the house-style answer, relative to the starting model
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(out / "adapter").eval()
    pairs = _held_out_pairs(tmp_path, toy_model)
    objective = DirectPreference(beta=1.0)
    with torch.no_grad():
        batch = objective.batch(pairs, None, pad_id=0)
        _, metrics = objective.loss(model, batch)
    accuracy = metrics["reward_accuracy"].item() / len(pairs)
    assert accuracy >= 0.9, accuracy
