"""The round trip a team does, on the real small base (SmolLM2-135M-Instruct, pulled once per machine): its GGUF
file in (`--model FILE.gguf`), a LoRA run with Auto's values, GGUF out, and the file loaded back by transformers.
Two steps only: the point is the files, not the training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf_helpers import metadata, read_back

from finetune.commands.cli import main
from finetune.models.bases import gguf_path
from finetune.models.known_bases import KNOWN_BASES
from finetune.ship.export.gguf import write_gguf

pytestmark = pytest.mark.real_model
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
BASE = KNOWN_BASES["smollm2-135m-instruct"]
# f16 rounds every weight: on this 30-layer model the largest logit moved by 0.046 (measured; its logits span about
# 30, so under 0.2%), past the toys' 2e-2; the greedy answers stay the same. f32 is held to the toys' 1e-4.
BOUNDS = {"f32": 1e-4, "f16": 0.1}


def test_gguf_in_lora_with_auto_gguf_out_and_loaded_back(smollm2, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("".join((EXAMPLES / "train.jsonl").read_text(encoding="utf-8").splitlines(True)[:16]))
    run, exported = tmp_path / "run", tmp_path / "export"
    gguf_in = gguf_path(BASE)

    # replay and the adapter scale off: the point is the files, and Auto's retention mechanisms would have the base
    # answer 302 general prompts first (about 7 min on 2 cores; measured in bench/AUTO.md, tested on the toy)
    argv = ["train", str(data), "--model", str(gguf_in), "--out", str(run), "--max-steps", "2"]
    assert main([*argv, "--replay", "off", "--adapter-scale", "off"]) == 0
    plan = json.loads((run / "plan.json").read_text())
    assert plan["method"] == "lora" and {"lora_rank", "learning_rate", "batch_size"} <= set(plan["auto"])
    assert plan["base_origin"]["sha256"] == BASE.gguf_sha256

    assert main(["export", str(run), "--out", str(exported), "--gguf", "--gguf-type", "f32"]) == 0
    assert "model.gguf (f32)" in capsys.readouterr().out
    f16 = write_gguf(exported, tmp_path / "f16.gguf", "f16", name=run.name, base=BASE.name)
    for gguf_type, written in (("f32", exported / "model.gguf"), ("f16", f16)):
        result = read_back(exported, written)
        print(f"{gguf_type}: max |logit difference| {result['max_abs_diff']:.3g}")  # shown with -s
        assert result["max_abs_diff"] <= BOUNDS[gguf_type], result["max_abs_diff"]
        assert result["same_tokens"] and result["gguf_answers"] == result["answers"]

    meta = metadata(exported / "model.gguf")
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 30
    assert "<|im_start|>" in meta["tokenizer.chat_template"]  # SmolLM2's own template, carried through
    assert f"sha256 {BASE.gguf_sha256}" in (exported / "README.md").read_text()
