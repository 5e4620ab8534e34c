"""`finetune plan` through the command line: JSON keys, the what-if form, the data-file form, errors, no torch."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.data.prepare import PreparedData
from finetune.data.types import DataSummary

REQUIRED_KEYS = {
    "examples", "validation_examples", "epochs", "batch_size", "grad_accum", "devices", "effective_batch",
    "steps_per_epoch", "total_steps", "warmup_steps", "last_batch", "learning_rate", "lora_rank",
    "times_each_example_seen", "tokens_in_file", "tokens_processed", "memory", "cost", "auto", "warnings",
    "conversations", "messages",
}  # fmt: skip


def plan_json(capsys, *args: str) -> dict:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_what_if_json_has_every_key(capsys):
    data = plan_json(capsys, "--examples", "800")
    assert set(data) >= REQUIRED_KEYS
    assert isinstance(data["memory"], dict) and isinstance(data["cost"], dict) and isinstance(data["auto"], dict)
    assert all(set(w) == {"code", "message", "settings"} for w in data["warnings"])  # settings: the ones it names
    assert data["what_if"] is True and data["examples"] == 800


def test_what_if_worked_examples(capsys):
    data = plan_json(capsys, "--examples", "800", "--batch-size", "8", "--epochs", "3", "--tokens", "400000")
    assert (data["steps_per_epoch"], data["total_steps"], data["warmup_steps"]) == (100, 300, 15)
    assert data["tokens_in_file"] == 400_000 and data["tokens_processed"] == 1_200_000
    assert data["times_each_example_seen"] == 3
    data = plan_json(capsys, "--examples", "800", "--batch-size", "32", "--epochs", "3")
    assert (data["steps_per_epoch"], data["total_steps"]) == (25, 75)
    data = plan_json(capsys, "--examples", "800", "--batch-size", "4", "--grad-accum", "8", "--devices", "1")
    assert data["effective_batch"] == 32


def test_what_if_without_tokens(capsys):
    data = plan_json(capsys, "--examples", "800")
    assert data["tokens_in_file"] is None and data["tokens_processed"] is None
    assert data["cost"]["token_cost"] is None
    assert "tokens_unknown" in [w["code"] for w in data["warnings"]]


def test_what_if_examples_are_training_records(capsys):
    data = plan_json(capsys, "--examples", "800", "--val-fraction", "0.2")
    assert data["examples"] == 800 and data["validation_examples"] == 200


def test_what_if_with_prices_and_model(capsys):
    data = plan_json(
        capsys, "--examples", "800", "--tokens", "400000", "--model", "Qwen/Qwen2.5-0.5B", "--gpu", "l4-24gb",
        "--price-per-million-tokens", "2", "--gpu-hour-price", "1",
    )  # fmt: skip
    assert data["cost"]["token_cost"] == pytest.approx(2.4)
    assert data["cost"]["estimate"] is True and data["cost"]["time_cost"] > 0
    assert data["memory"]["known"] and data["memory"]["device"] == "l4-24gb"
    for part in ("weights", "gradients", "optimizer", "activations", "total"):
        assert data["memory"][part] > 0


def test_human_output_shows_records_messages_conversations_and_reasons(capsys):
    assert main(["plan", "--examples", "100", "--batch-size", "8", "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    for word in ("records", "conversations", "messages", "Why (Auto)", "learning_rate", "[few_total_steps]"):
        assert word in out, word


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--examples"),
        (["data.jsonl", "--examples", "800"], "not both"),
        (["data.jsonl", "--tokens", "5"], "--tokens goes with --examples"),
        (["--examples", "0"], "at least 1"),
        (["--examples", "1", "--batch-size", "8", "--last-batch", "drop"], "no step"),
        (["--examples", "10", "--epochs", "0"], "--epochs"),
    ],
)
def test_user_errors_exit_1(capsys, args, message):
    assert main(["plan", *args]) == 1
    assert message in capsys.readouterr().err


def _summary(**changes) -> DataSummary:
    values = dict(
        examples=300, validation_examples=40, conversations=100, validation_conversations=12, messages=900,
        tokens_in_file=90_000, target_tokens=30_000, max_record_tokens=700,
        p50_record_tokens=280, p95_record_tokens=600, truncated_records=0, truncated_tokens=0, dropped_records=0,
        duplicates_removed=0, val_fraction=0.1, val_fraction_reason="Auto: 10%",
    )  # fmt: skip
    values.update(changes)
    return DataSummary(**values)


def test_data_file_uses_prepare_data(monkeypatch, capsys):
    seen = {}

    def fake_prepare(config, tokenizer=None, workers=None, facts=None):
        seen["data"] = config.data
        shortened = dict(truncated_records=2, truncated_tokens=50, shortened_at=("train.jsonl:3", "train.jsonl:8"))
        return PreparedData([], [], _summary(max_seq_len=700, **shortened))

    monkeypatch.setattr("finetune.data.dispatch.prepare_data", fake_prepare)
    monkeypatch.setattr("finetune.data.dispatch.is_preference_file", lambda path: False)
    data = plan_json(capsys, "train.jsonl", "--batch-size", "8", "--epochs", "3")
    assert seen["data"] == "train.jsonl"
    assert (data["examples"], data["conversations"], data["messages"]) == (300, 100, 900)
    assert (data["steps_per_epoch"], data["total_steps"], data["tokens_processed"]) == (38, 114, 270_000)
    codes = [w["code"] for w in data["warnings"]]
    assert codes.count("truncated_examples") == 1
    assert "records_differ_from_conversations" in codes


def test_real_data_file_without_a_model(tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(60)
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    data = plan_json(capsys, str(path))
    assert data["examples"] + data["validation_examples"] == 60
    assert data["conversations"] == data["examples"] and data["messages"] == 2 * data["examples"]
    assert data["tokens_in_file"] > 0 and data["tokens_processed"] == data["tokens_in_file"] * data["epochs"]


def test_what_if_imports_no_torch():  # what keeps it fast; no timed assertion (the machine's load is not ours)
    script = textwrap.dedent(
        """
        import contextlib, io, json, sys
        from finetune.commands.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["plan", "--examples", "800", "--tokens", "400000", "--model", "Qwen/Qwen2.5-7B"]) == 0
            assert main(["plan", "--examples", "800", "--json"]) == 0
        heavy = [m for m in ("torch", "transformers", "peft", "tokenizers") if m in sys.modules]
        print(json.dumps({"heavy": heavy}))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["heavy"] == []


def test_data_file_with_the_toy_model(toy_model, capsys):
    """The whole data path: the bundled examples tokenized by the toy model's tokenizer, its real size counted."""
    examples = Path(__file__).resolve().parents[3] / "examples" / "train.jsonl"
    data = plan_json(capsys, str(examples), "--model", str(toy_model), "--gpu", "cpu")
    assert data["tokens_exact"] and data["tokens_processed"] == data["tokens_in_file"] * data["epochs"]
    assert data["memory"]["known"] and "safetensors" in data["memory"]["source"]
    assert data["memory"]["compute_dtype"] == "fp32" and data["memory"]["fits_device"] is None
    assert data["cost"]["seconds"] > 0 and data["gradient_checkpointing"] is False
