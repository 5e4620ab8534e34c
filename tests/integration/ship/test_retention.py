"""`finetune eval RUN --retention`: the base and the tuned model on the general set; a damaged run is flagged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from finetune.commands.cli import main
from finetune.data.tokenize import load_tokenizer
from finetune.settings.wording import render, rendered
from finetune.ship.eval import retention
from finetune.ship.eval.evaluation_estimate import evaluation_estimate
from finetune.ship.eval.general_set import load_general_set
from finetune.ship.eval.generate import generate_ids
from finetune.ship.run_folder import locate_weights
from finetune.ship.toy import general_corpus
from finetune.train.model import load_model

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
KEYS = {
    "method", "general_set", "n", "accuracy", "rule_pass_rate", "choice_accuracy", "by_kind", "kl", "settings",
    "flag", "flagged", "message", "remedies", "rows", "choices", "seconds", "base_model", "tuned",
    "instruction_following", "instructions_kept", "team_voice", "by_instruction", "requests", "cut_at_cap",
}  # fmt: skip
MEASURE_KEYS = {"n", "base", "tuned", "change", "dropped", "p", "p_holm"}


@pytest.fixture
def run_copy(lora_run, tmp_path) -> Path:
    """The shared LoRA run, copied: these tests write into their run folder."""
    return Path(shutil.copytree(lora_run, tmp_path / "run"))


def test_eval_retention_writes_every_number_and_refreshes_the_card(run_copy, monkeypatch, capsys):
    monkeypatch.setattr(retention, "MAX_NEW_TOKENS", 6)  # the whole set, short answers: seconds on the toy
    monkeypatch.setattr(retention, "REQUEST_TOKENS", 8)
    args = ["eval", str(run_copy), "--retention", "--limit", "2", "--max-new-tokens", "4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    report = json.loads((run_copy / "retention.json").read_text())
    assert set(report) == KEYS
    prompts, choices = load_general_set()
    assert report["general_set"]["prompts"] == len(prompts) and report["n"]["choices"] == len(choices)
    assert report["n"]["answers"] + report["n"]["rules"] == len(prompts) == len(report["rows"])
    for key in retention.MEASURES:
        numbers = report[key]
        assert set(numbers) == MEASURE_KEYS
        for side in ("base", "tuned"):
            assert numbers[side]["low"] <= numbers[side]["rate"] <= numbers[side]["high"]
        assert numbers["change"]["low"] <= numbers["change"]["value"] <= numbers["change"]["high"]
    rows = report["rows"]
    answers = [r for r in rows if r["kind"] != "rule"]
    assert report["accuracy"]["base"]["correct"] == sum(r["base_passed"] for r in answers)
    assert report["accuracy"]["tuned"]["correct"] == sum(r["tuned_passed"] for r in answers)
    assert report["kl"]["direction"] == "KL(tuned || base)" and report["kl"]["tokens"] > 0
    assert report["kl"]["mean_per_token"] > 0  # the adapter moved the model
    assert report["settings"]["max_new_tokens"] == 6 and report["seconds"]["total"] > 0
    # the flag is Holm's over the measures' exact tests (issue 47: family.py), and it brings the remedies
    dropped = [key for key in retention.MEASURES if report[key]["dropped"]]
    assert all(report[key]["p_holm"] <= 0.05 for key in dropped)
    assert report["flagged"][: len(dropped)] == dropped and report["flag"] == bool(report["flagged"])
    head_trained = json.loads((run_copy / "plan.json").read_text())["lora_train_head"]
    assert report["remedies"] == (rendered(retention.remedies("lora", head_trained)) if report["flag"] else [])
    cut = report["cut_at_cap"]  # per side, the share of answers cut at the token cap (issue 47)
    assert cut["prompts"]["cap"] == report["settings"]["max_new_tokens"] and 0 <= cut["requests"]["tuned"]["share"] <= 1

    # the same call's eval.json and eval.html carry the summary, the card in the run's adapter/ the section
    evaluation = json.loads((run_copy / "eval.json").read_text())
    assert evaluation["examples"] == 2 and evaluation["retention"]["accuracy"] == report["accuracy"]
    assert "rows" not in evaluation["retention"]
    assert "Retention" in (run_copy / "eval.html").read_text()
    card = (run_copy / "adapter" / "README.md").read_text()
    assert "## Retention" in card and "## Evaluation" in card and report["message"] in card
    assert "Retention" in printed and "KL(tuned || base)" in printed and "retention.json" in printed

    # the LoRA run's base side is the base itself: the adapter (and the trained output layer) switched off
    weights = locate_weights(run_copy)
    tokenizer = load_tokenizer(weights.tokenizer)
    messages = [p.messages() for p in prompts]
    plain = generate_ids(load_model(weights.base), tokenizer, messages, 6, retention.BATCH)  # the same batches
    assert [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in plain] == [r["base"] for r in rows]


def test_without_a_test_set_retention_runs_alone(run_copy, monkeypatch, capsys):
    (run_copy / "test.jsonl").unlink()
    (run_copy / "eval.json").unlink(missing_ok=True)  # the shared run may have been evaluated by another test
    monkeypatch.setattr(retention, "MAX_NEW_TOKENS", 2)
    assert main(["eval", str(run_copy), "--retention", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert "rows" not in printed and printed["accuracy"]["n"] > 0
    assert (run_copy / "retention.json").exists() and not (run_copy / "eval.json").exists()


def test_a_limited_check_says_its_estimate_first_then_each_batch_and_that_it_was_limited(run_copy, monkeypatch,
                                                                                          capsys):  # fmt: skip
    """Issue 49: the estimate (the service's own rule) before anything loads, a line per batch while the models
    answer, and `--retention-limit N`: N of each kind, spread evenly, said in the verdict."""
    monkeypatch.setattr(retention, "MAX_NEW_TOKENS", 2)
    monkeypatch.setattr(retention, "REQUEST_TOKENS", 2)
    monkeypatch.setattr(retention, "BATCH", 4)
    limit = 6  # two batches of general prompts: 4, then 2
    assert main(["eval", str(run_copy), "--retention", "--retention-only", "--retention-limit", str(limit)]) == 0
    lines = capsys.readouterr().err.splitlines()
    estimate = evaluation_estimate(run_copy, retention=True, test=False, limit=limit)
    assert lines[0].startswith(f"Evaluation: the base and the tuned model answer the retention check's {limit} general")
    assert f"limited to {limit} of each: wider intervals" in lines[0] and estimate["how"] in lines[0]
    assert estimate["seconds"] < evaluation_estimate(run_copy, retention=True, test=False)["seconds"]
    answered = [line for line in lines if line.startswith("Retention check: ")]
    assert answered[0].startswith(f"Retention check: {retention.BATCH} of {limit} general prompts answered (")
    assert answered[1].startswith(f"Retention check: {limit} of {limit} general prompts answered (")  # a line a batch
    assert any(line.startswith(f"Retention check: {limit} of {limit} requests for a longer") for line in answered)
    report = json.loads((run_copy / "retention.json").read_text())
    prompts, choices = load_general_set()
    expected = {"prompts": limit, "choices": min(limit, len(choices)), "requests": limit, "limit": limit}
    assert report["general_set"] | {"digest": None} == expected | {"digest": None}
    assert [row["id"] for row in report["rows"]] == [p.id for p in retention.subset(prompts, limit)]
    assert report["message"].endswith("(spread evenly): wider intervals than the whole set's.")
    assert main(["eval", str(run_copy), "--retention-limit", "3"]) == 1  # not without --retention
    assert "--retention-limit goes with --retention" in capsys.readouterr().err
    assert main(["eval", str(run_copy), "--retention", "--retention-limit", "0"]) == 1
    assert "--retention-limit must be at least 1" in capsys.readouterr().err


def test_the_remedies_name_the_output_layer_only_when_the_run_trained_it():
    assert not any("--lora-train-head" in render(r) for r in retention.remedies("lora", head_trained=False))
    assert any("--lora-train-head off" in render(r) for r in retention.remedies("lora", head_trained=True))
    assert any("--method lora" in render(r) for r in retention.remedies("full"))


def test_the_remedies_name_each_setting_in_its_readers_terms():
    assert any("--base-method lora" in render(r, "cli") for r in retention.remedies("full", objective="dpo"))
    api = [render(r, "api") for r in retention.remedies("lora", head_trained=True)]
    assert any("method.supervised.hyperparameters.lora_train_head = off" in r for r in api)
    assert not any("--lora" in r or "--lr" in r or "--epochs" in r for r in api)  # `finetune eval` flags stay


def test_retention_needs_a_run_folder(capsys):
    assert main(["eval", str(EXAMPLES / "test.jsonl"), "--model", "x", "--retention"]) == 1
    assert "--retention compares a run with its base" in capsys.readouterr().err


def test_a_zero_adapter_is_the_base(run_copy):
    """LoRA B matrices at zero and the base's own output layer: the tuned model is the base, exactly."""
    weights = locate_weights(run_copy)
    path = run_copy / "adapter" / "adapter_model.safetensors"
    tensors = load_file(path)
    head = load_model(weights.base).lm_head.weight.detach()
    for name, tensor in tensors.items():
        if "lora_B" in name:
            tensors[name] = torch.zeros_like(tensor)
        elif name.endswith("lm_head.weight"):
            tensors[name] = head.clone()
    save_file(tensors, path)
    report = retention.check_retention(run_copy, max_new_tokens=8, limit=30)
    assert report["kl"]["mean_per_token"] == pytest.approx(0.0, abs=1e-6)
    assert all(row["base"] == row["tuned"] for row in report["rows"])
    assert all(c["base"] == c["tuned"] for c in report["choices"])
    for key in retention.MEASURES:
        assert report[key]["base"] == report[key]["tuned"] and report[key]["change"]["value"] == 0
    assert report["flag"] is False


@pytest.fixture(scope="module")
def terse_base(toy_model, tmp_path_factory) -> Path:
    """A base with something to lose: the toy taught to answer every question with "YES", which keeps five of the
    set's twelve rules (one word, at most five words, capitals, no commas, start with Yes or No). The pretrained
    toy base has too little to lose: its answers hardly depend on the question (3% accuracy on the set, measured)."""
    folder = tmp_path_factory.mktemp("terse")
    questions = [next(m for m in c["messages"] if m["role"] == "user") for c in general_corpus(96, seed=11)]
    lines = [json.dumps({"messages": [q, {"role": "assistant", "content": "YES"}]}) for q in questions]
    (folder / "yes.jsonl").write_text("\n".join(lines) + "\n")
    args = ["train", str(folder / "yes.jsonl"), "--model", str(toy_model), "--out", str(folder / "run")]
    assert (
        main([*args, "--method", "full", "--lr", "3e-3", "--epochs", "3", "--batch-size", "8", "--val-fraction", "0"])
        == 0
    )
    return folder / "run" / "model"


def test_a_damaged_run_is_flagged(terse_base, tmp_path):
    """Every weight of the base trained at a huge learning rate for a few steps: it forgets how to answer."""
    out = tmp_path / "damaged"
    args = ["train", str(EXAMPLES / "train.jsonl"), "--model", str(terse_base), "--out", str(out)]
    assert main([*args, "--method", "full", "--lr", "0.3", "--max-steps", "3", "--batch-size", "8"]) == 0
    report = retention.check_retention(out)
    rules = report["rule_pass_rate"]
    assert rules["base"]["rate"] >= 0.4 and rules["tuned"]["rate"] < rules["base"]["rate"]
    assert report["flag"] is True and "rule_pass_rate" in report["flagged"] and rules["change"]["high"] < 0
    assert report["kl"]["mean_per_token"] > 1.0
    assert report["remedies"] == retention.remedies("full") and "more than chance" in report["message"]
    assert any("--method lora" in render(remedy) for remedy in report["remedies"])


def test_a_full_run_on_a_base_without_a_chat_template(tmp_path, monkeypatch, capsys):
    """Training added ChatML's tokens to a template-less base (the embeddings grown); the check loads the base as
    training did, grown to the run's tokenizer, instead of indexing past its embeddings (issue 47)."""
    from gguf_fixtures import plain_base

    base = plain_base(tmp_path / "plain")
    out = tmp_path / "run"
    args = ["train", str(EXAMPLES / "train.jsonl"), "--model", str(base), "--out", str(out), "--method", "full"]
    assert main([*args, "--max-steps", "2", "--batch-size", "4", "--dtype", "fp32"]) == 0
    rows = json.loads((base / "config.json").read_text())["vocab_size"]
    assert len(load_tokenizer(str(out / "model"))) > rows  # ChatML's tokens were added: the base lacks their rows
    monkeypatch.setattr(retention, "MAX_NEW_TOKENS", 3)
    monkeypatch.setattr(retention, "REQUEST_TOKENS", 3)
    assert main(["eval", str(out), "--retention", "--limit", "2"]) == 0
    report = json.loads((out / "retention.json").read_text())
    assert report["method"] == "full" and report["kl"]["tokens"] > 0
