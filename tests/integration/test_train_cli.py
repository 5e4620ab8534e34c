"""`finetune train` end to end on the toy model: outputs, loading back, plan obeyed, no overwrite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from finetune.commands.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SMALL = ["--epochs", "1", "--batch-size", "8", "--max-seq-len", "512", "--eval-every", "5"]


@pytest.fixture(scope="module")
def lora_run(toy_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "run"
    code = main(["train", str(EXAMPLES / "train.jsonl"), "--model", str(toy_model), "--out", str(out), *SMALL])
    assert code == 0
    return out


def test_lora_run_writes_every_output(lora_run):
    for name in ("plan.json", "metrics.jsonl", "loss_curve.png", "report.json", "checkpoints", "adapter"):
        assert (lora_run / name).exists(), name
    plan = json.loads((lora_run / "plan.json").read_text())
    rows = [json.loads(line) for line in (lora_run / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((lora_run / "report.json").read_text())
    assert len(rows) == plan["total_steps"] == report["steps_taken"]
    assert report["tokens_processed"] == plan["tokens_processed"] and report["tokens_match"] is True
    assert report["diagnosis"]["kind"] and report["diagnosis"]["next_step"]
    assert report["final_is_best"] is True and report["best_step"] is not None
    assert any("val_loss" in row for row in rows)
    card = (lora_run / "adapter" / "README.md").read_text()  # the run's own model card, not PEFT's template
    assert "[More Information Needed]" not in card and "| method | lora |" in card
    assert not any((step / "README.md").exists() for step in (lora_run / "checkpoints").iterdir())


def test_adapter_loads_with_peft_and_changes_the_output(lora_run, toy_model):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(toy_model)
    ids = torch.tensor([[2, 30, 40, 50]])
    before = base(input_ids=ids).logits
    tuned = PeftModel.from_pretrained(base, lora_run / "adapter")
    assert not torch.allclose(tuned(input_ids=ids).logits, before)


def test_full_run_saves_a_loadable_model(toy_model, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "full"
    args = ["train", str(EXAMPLES / "train.jsonl"), "--model", str(toy_model), "--out", str(out), "--method", "full"]
    assert main([*args, *SMALL, "--max-steps", "4", "--val-fraction", "0"]) == 0
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert (out / "model" / "model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(toy_model)
    assert not torch.equal(model.lm_head.weight, base.lm_head.weight)
    report = json.loads((out / "report.json").read_text())
    assert report["steps_taken"] == 4 and report["final_is_best"] is False
    assert report["tokens_match"] is True  # --max-steps: the plan counts the tokens of the steps it keeps


def test_an_existing_run_is_never_overwritten(lora_run, toy_model, capsys):
    before = (lora_run / "metrics.jsonl").read_text()
    code = main(["train", str(EXAMPLES / "train.jsonl"), "--model", str(toy_model), "--out", str(lora_run), *SMALL])
    assert code == 1
    assert "--resume" in capsys.readouterr().err
    assert (lora_run / "metrics.jsonl").read_text() == before


def test_settings_from_yaml_with_flag_overrides(toy_model, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"data: {EXAMPLES / 'train.jsonl'}\nmodel: {toy_model}\nout: {tmp_path / 'yaml-run'}\n"
        "epochs: 1\nbatch-size: 16\nmax_steps: 3\nval_fraction: 0\n"
    )
    assert main(["train", "--config", str(config), "--max-steps", "2"]) == 0
    plan = json.loads((tmp_path / "yaml-run" / "plan.json").read_text())
    assert plan["batch_size"] == 16 and plan["total_steps"] == 2


def test_bad_data_exits_1_with_the_line_and_no_traceback(toy_model, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\nnot json\n')
    result = subprocess.run(
        [sys.executable, "-m", "finetune", "train", str(bad), "--model", str(toy_model), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"{bad}:2" in result.stderr and "not_json" in result.stderr
    assert not (tmp_path / "o").exists()


def test_the_library_call_works_twice_prints_nothing_and_stores_a_base_path_that_resolves(
    toy_model, tmp_path, monkeypatch, capsys
):
    import finetune
    from finetune.run import TrainResult

    monkeypatch.chdir(toy_model.parent)  # the model given as a relative path, as a user types it
    for name in ("one", "two"):
        config = finetune.RunConfig(
            data=str(EXAMPLES / "train.jsonl"), model=toy_model.name, out=str(tmp_path / name),
            epochs=1, batch_size=8, max_steps=2, val_fraction=0, max_seq_len=512,
        )  # fmt: skip
        result = finetune.train(config)
        assert isinstance(result, TrainResult) and result.report["steps_taken"] == result.plan.total_steps == 2
    assert capsys.readouterr() == ("", "")

    from peft import AutoPeftModelForCausalLM

    adapter_config = json.loads((tmp_path / "one" / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(toy_model.resolve())
    monkeypatch.chdir(tmp_path)
    AutoPeftModelForCausalLM.from_pretrained(tmp_path / "one" / "adapter")  # from another directory


def test_train_json_prints_the_report_on_stdout_and_the_rest_on_stderr(toy_model, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "finetune", "train", str(EXAMPLES / "train.jsonl"), "--model", str(toy_model)]
    command += ["--out", str(out), *SMALL, "--max-steps", "2", "--val-fraction", "0", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads((out / "report.json").read_text())
    lines = result.stderr.splitlines()
    assert any(line.startswith("step 2/2") for line in lines)  # progress, as plain lines in a pipe
    training = next(line for line in lines if line.startswith("Training "))
    assert training.endswith("messages; format OpenAI chat (messages)")  # the data line whole
    assert max(len(line) for line in lines) > 100  # advice sentences stay one line: not wrapped at 80 columns


def test_a_hub_id_without_network_fails_at_once_with_what_to_do(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    args = ["train", str(EXAMPLES / "train.jsonl"), "--model", "some-org/some-model", "--out", str(tmp_path / "o")]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "cannot reach the Hugging Face hub" in err and "local model folder" in err and "HF_HUB_OFFLINE=1" in err
    assert not (tmp_path / "o").exists()


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`finetune validate --json | head`: the pipe closes under a large report; exit 1, nothing on stderr."""
    big = tmp_path / "big.jsonl"
    big.write_text("{not json\n" * 30_000)  # 30,000 errors: a report far larger than a pipe holds
    validate = subprocess.Popen(
        [sys.executable, "-m", "finetune", "validate", str(big), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert validate.stdout.read(10) == b'{"ok": fal'
    validate.stdout.close()  # the reader leaves, as `head -c 10` does
    stderr = validate.stderr.read().decode()
    assert validate.wait(timeout=120) == 1 and "Traceback" not in stderr, stderr
