"""The real base: SmolLM2-135M-Instruct from PyPI (fixture `smollm2`, pulled once per machine). Few steps only:
it trains at a few hundred tokens/s on 2 cores. Select these with `pytest -m real_model`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.models.bases import gguf_path
from finetune.models.known_bases import KNOWN_BASES

pytestmark = pytest.mark.real_model
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = KNOWN_BASES["smollm2-135m-instruct"]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    """Twelve of the bundled conversations: enough for two steps."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join((EXAMPLES / "train.jsonl").read_text(encoding="utf-8").splitlines(True)[:12]))
    return path


def test_pulling_again_makes_no_network_call(smollm2, monkeypatch, capsys):
    from finetune.models import bases

    def no_pip(*args, **kwargs):
        raise AssertionError("pip was called for a pulled base")

    monkeypatch.setattr(bases.subprocess, "run", no_pip)
    assert main(["base", "pull", BASE.name]) == 0
    assert capsys.readouterr().out.strip() == str(smollm2)
    assert main(["base", "list"]) == 0
    assert f"pulled: {smollm2}" in capsys.readouterr().out


def test_the_real_base_answers_a_support_question(smollm2):
    from finetune.data.tokenize import load_tokenizer
    from finetune.data.types import Conversation, Message
    from finetune.ship.eval.generate import generate_answers
    from finetune.train.model import load_model

    facts = json.loads((smollm2 / "config.json").read_text())
    assert (facts["num_hidden_layers"], facts["hidden_size"], facts["vocab_size"]) == (30, 576, 49152)
    assert facts["tie_word_embeddings"]
    tokenizer = load_tokenizer(BASE.name)
    assert "<|im_start|>" in tokenizer.chat_template  # ChatML, from the GGUF's metadata
    question = Conversation((Message("user", "How do I reset my password?"), Message("assistant", "")), line=1)
    answer = generate_answers(load_model(BASE.name), tokenizer, [question], max_new_tokens=40)[0]
    assert "password" in answer.lower()


@pytest.mark.parametrize("how", ["name", "gguf"])
def test_train_on_the_real_base(smollm2, small_data, tmp_path, how):
    model = BASE.name if how == "name" else str(gguf_path(BASE))
    out = tmp_path / "run"
    argv = ["train", str(small_data), "--model", model, "--out", str(out), "--max-steps", "2", "--batch-size", "2"]
    argv += ["--replay", "off", "--adapter-scale", "off"]  # no 7-minute replay generation for a 2-step run
    assert main([*argv, "--val-fraction", "0", "--max-seq-len", "256"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert plan["model"] == str(smollm2) and report["steps_taken"] == 2
    assert plan["chat_template"] == "model" and "carries a chat template" in plan["auto"]["chat_template"]
    assert plan["base_origin"]["sha256"] == BASE.gguf_sha256 and plan["base_origin"]["base"] == BASE.name
    assert f"sha256 {BASE.gguf_sha256}" in (out / "adapter" / "README.md").read_text()
