"""A GGUF of an architecture other than Llama (Qwen2), of a base model with no chat template, trains from the
command line: converted once, ChatML added (the plan says so and why), the adapter carries the grown
embeddings and loads back, export merges it, and plan.json and the card name the GGUF file and its hash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gguf_fixtures import plain_base, write_gguf

from finetune import run as run_module
from finetune.commands.cli import main
from finetune.models.gguf import cache_folder, file_sha256

REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-gguf")
    return write_gguf(plain_base(root / "base", "qwen2"), root / "qwen2-base.gguf")


def test_a_qwen2_gguf_without_a_template_trains_exports_and_names_its_source(qwen_gguf, tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from finetune.data.prompting import prompt_ids
    from finetune.ship.run_folder import load_for_generation, locate_weights

    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    titles = []
    plot = run_module.plot_loss_curve
    monkeypatch.setattr(run_module, "plot_loss_curve", lambda *a, **k: titles.append(k.get("title")) or plot(*a, **k))
    out = tmp_path / "run"
    argv = ["train", str(REPO_EXAMPLES / "train.jsonl"), "--model", str(qwen_gguf), "--out", str(out)]
    assert main([*argv, "--max-steps", "2", "--max-seq-len", "256"]) == 0
    assert titles == ["qwen2-base.gguf"]  # the loss curve names the model, not its cache folder

    sha = file_sha256(qwen_gguf)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["model"] == str(cache_folder(sha))
    assert plan["base_origin"] == {"gguf_file": str(qwen_gguf.resolve()), "sha256": sha}
    assert plan["chat_template"] == "chatml" and "no chat template" in plan["auto"]["chat_template"]
    card = (out / "adapter" / "README.md").read_text()
    assert f"| converted from | {qwen_gguf.resolve()} (GGUF, sha256 {sha}) |" in card
    assert "| chat template | chatml |" in card
    adapter_config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["trainable_token_indices"] == {"embed_tokens": [400, 401]}  # tied head follows
    assert "<|im_end|>" in (out / "adapter" / "tokenizer.json").read_text()

    # the adapter loads on the base (grown to the run's tokenizer) and merges into the same function
    model, tokenizer = load_for_generation(locate_weights(out))
    ids = torch.tensor([prompt_ids(tokenizer, [{"role": "user", "content": "hi"}])])
    assert isinstance(model, PeftModel)
    assert main(["export", str(out), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, model(ids).logits, atol=1e-5)

    # eval takes the GGUF file as --model as well (converted already: reused)
    assert main(["eval", str(REPO_EXAMPLES / "test.jsonl"), "--model", str(qwen_gguf), "--limit", "1",
                 "--max-new-tokens", "2", "--json"]) == 0  # fmt: skip
