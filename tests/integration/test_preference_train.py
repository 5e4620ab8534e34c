"""`finetune train PREFS --method dpo` on the bundled preference set: the toy model learns the team's preference.

The held-out check uses prompts of examples/test.jsonl, which the preference set never saw: after tuning,
the house-style answer gains on the generic one compared with the starting model (the reward accuracy of
held-out pairs), far above chance (0.5), and the tuned model gives the house-style answer a higher
probability, the generic one a lower probability, than the starting model did. (The toy model's weights are
random, so its sampled text is not readable: the answers' probabilities are what is checked.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from finetune.commands.cli import main
from finetune.data.pairs import prepare_pairs
from finetune.data.tokenize import load_tokenizer
from finetune.run import train
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.train.loop import TrainingInterrupted
from finetune.train.preference import DirectPreference, sequence_logps

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
    # the answers themselves moved: on unseen prompts the team's answer became more likely than under the starting
    # model and the generic one less likely (not only their difference)
    with torch.no_grad():
        tuned, _ = sequence_logps(model, batch)
        with model.disable_adapter():
            start, _ = sequence_logps(model, batch)
    gain = tuned - start
    assert (gain[0::2] > 0).double().mean() >= 0.9 and (gain[1::2] < 0).double().mean() >= 0.9, gain


@pytest.mark.parametrize("base_method", ["lora", "full"])
def test_a_dpo_run_stopped_by_sigterm_resumes_to_the_same_weights(toy_model, tmp_path, base_method):
    """Through train() (plan, fingerprint, checkpoints): stop after step 2, --resume, bit-identical final weights."""
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join((EXAMPLES / "prefs.jsonl").read_text().splitlines(keepends=True)[:20]))
    settings = dict(
        data=str(data), model=str(toy_model), method="dpo", base_method=base_method, epochs=1, batch_size=4,
        lr=2e-3, val_fraction=0.2, save_every=1, eval_every=2, sft_weight=0.1,
    )  # fmt: skip
    whole = train(RunConfig(**settings, out=str(tmp_path / "whole")))

    def stop_after_step_2(row):
        if row["step"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    cut = tmp_path / "cut"
    with pytest.raises(TrainingInterrupted):
        train(RunConfig(**settings, out=str(cut)), on_step=stop_after_step_2)
    # the fingerprint holds on a DPO resume: another learning rate is refused, naming the setting
    with pytest.raises(UserError, match="learning rate"):
        train(RunConfig(**{**settings, "lr": 1e-3}, out=str(cut), resume=True))
    resumed = train(RunConfig(**settings, out=str(cut), resume=True))
    assert resumed.plan.total_steps == whole.plan.total_steps == 4
    name = "adapter_model.safetensors" if base_method == "lora" else "model.safetensors"
    a, b = load_file(whole.final_weights / name), load_file(resumed.final_weights / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def rows(out):  # the speed of a step is the only number allowed to differ
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in lines]

    assert rows(cut) == rows(tmp_path / "whole") and "val_reward_accuracy" in rows(cut)[-1]


def test_test_fraction_is_refused_with_dpo_before_anything_is_written(toy_model, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", str(EXAMPLES / "prefs.jsonl"), "--model", str(toy_model), "--out", str(out), "--method", "dpo"]
    assert main([*args, "--test-fraction", "0.1"]) != 0
    err = capsys.readouterr().err
    assert "--test-fraction" in err and "does not apply to --method dpo" in err
    assert not out.exists()
