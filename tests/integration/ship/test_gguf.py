"""`finetune export RUN --gguf`: the file is checked by an independent reader, transformers (`gguf_file=`).

On 8 held-out prompts (examples/test.jsonl, rendered with the chat template) its logits equal those of the
exported transformers folder (f32 to 1e-4, f16 and bf16 to 2e-2, q8_0 within Q8_0_BOUND) and its greedy answers
are the same (f32, f16), for a LoRA run (merged) and a full run of the Llama toy and for LoRA runs of Qwen2 and
Qwen3 toys. llama.cpp itself is checked in test_gguf_llama_cpp.py when llama-cpp-python is installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gguf_helpers import metadata, read_back

from finetune.commands.cli import main

# q8_0 rounds every block of 32 weights to 8 bits: measured max |logit difference| 0.0061 to 0.0124 on the
# Llama, Qwen2 and Qwen3 toy runs below (Qwen3 the largest); the bound leaves 8x room for other seeds and
# torch builds. A real model's error depends on its weights: docs/gguf.md.
Q8_0_BOUND = 0.1
BOUNDS = {"f32": 1e-4, "f16": 2e-2, "bf16": 2e-2, "q8_0": Q8_0_BOUND}


def _check(result: dict, gguf_type: str) -> None:
    print(f"{gguf_type}: max |logit difference| {result['max_abs_diff']:.3g}")  # shown with -s: the measured bound
    assert result["max_abs_diff"] <= BOUNDS[gguf_type], result["max_abs_diff"]
    assert result["same_tokens"]  # the file's tokenizer encodes the prompts as the folder's does
    if gguf_type in ("f32", "f16"):
        assert result["gguf_answers"] == result["answers"]


def test_lora_run_round_trips_through_transformers(lora_run, tmp_path, capsys):
    from finetune.ship.export.gguf import write_gguf

    out = tmp_path / "merged"
    assert main(["export", str(lora_run), "--out", str(out), "--gguf", "--gguf-type", "f32"]) == 0
    assert "model.gguf (f32)" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".gguf", ".safetensors", ".md")) == [
        "README.md",
        "model.gguf",
        "model.safetensors",
    ]
    result = read_back(out, out / "model.gguf")
    _check(result, "f32")
    card = (out / "README.md").read_text()
    assert "- gguf" in card and "`model.gguf` in this folder" in card and "(weights f32)" in card

    meta = metadata(out / "model.gguf")
    assert meta["general.architecture"] == "llama" and meta["general.name"] == lora_run.name
    assert meta["general.base_model.0.name"] == "model"  # the base's folder name, not a path
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert meta["tokenizer.chat_template"].startswith("{%- if tools %}")
    assert meta["tokenizer.ggml.eos_token_id"] == 3 and meta["tokenizer.ggml.add_bos_token"] is False
    assert set(meta["tensor types"].values()) == {"F32"}

    for gguf_type in ("f16", "bf16", "q8_0"):  # the same writer the CLI calls, on the folder it exported
        target = write_gguf(out, tmp_path / f"{gguf_type}.gguf", gguf_type, name="x", base="y")
        _check(read_back(out, target, answers=gguf_type == "f16"), gguf_type)
        types = metadata(target)["tensor types"]
        assert types["blk.0.attn_norm.weight"] == "F32" and types["output_norm.weight"] == "F32"  # 1-D stay f32
        assert types["blk.0.attn_q.weight"] == gguf_type.upper()
    # the toy's MLP is 344 wide: not whole q8_0 blocks of 32, so its down projection falls back to f16
    assert types["blk.0.ffn_down.weight"] == "F16" and types["token_embd.weight"] == "Q8_0"


def test_full_run_round_trips_with_the_default_f16(full_run, tmp_path):
    out = tmp_path / "full"
    assert main(["export", str(full_run), "--out", str(out), "--gguf"]) == 0
    _check(read_back(out, out / "model.gguf"), "f16")
    meta = metadata(out / "model.gguf")
    assert meta["general.name"] == full_run.name and meta["tensor types"]["blk.1.ffn_up.weight"] == "F16"


def test_qwen_lora_runs_round_trip(qwen_lora_run, tmp_path):
    from finetune.ship.export.gguf import write_gguf

    out = tmp_path / "merged"
    assert main(["export", str(qwen_lora_run), "--out", str(out), "--gguf", "--gguf-type", "f32"]) == 0
    _check(read_back(out, out / "model.gguf"), "f32")
    meta = metadata(out / "model.gguf")
    architecture = json.loads((out / "config.json").read_text())["model_type"]
    assert meta["general.architecture"] == architecture and meta["tokenizer.ggml.pre"] == "qwen2"
    assert "output.weight" not in meta["tensor types"]  # tied to the embedding, as llama.cpp expects then
    if architecture == "qwen2":
        assert meta["tensor types"]["blk.0.attn_q.bias"] == "F32"
    else:
        assert meta["tensor types"]["blk.0.attn_k_norm.weight"] == "F32" and meta["qwen3.attention.key_length"] == 128
    for gguf_type in ("f16", "q8_0"):
        target = write_gguf(out, tmp_path / f"{gguf_type}.gguf", gguf_type)
        _check(read_back(out, target, answers=gguf_type == "f16"), gguf_type)


# ------------------------------------------------------------------------------------------------- refusals


def _fake_run(tmp_path: Path, config: dict, tokenizer: dict | None = None) -> Path:
    """A LoRA run on a base that has a config (and maybe a tokenizer) but no weights: a refusal must come first."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(config))
    if tokenizer is not None:
        (base / "tokenizer.json").write_text(json.dumps(tokenizer))
    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    (run / "plan.json").write_text(json.dumps({"model": str(base)}))
    return run


def test_an_unsupported_architecture_is_one_sentence_before_any_weights_load(tmp_path, capsys):
    run = _fake_run(tmp_path, {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    out = tmp_path / "out"
    assert main(["export", str(run), "--out", str(out), "--gguf"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: GGUF export does not support") and "gpt2 (GPT2LMHeadModel)" in err
    assert "Qwen2 and Qwen3" in err and "Traceback" not in err and err.count("\n") == 1
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["base", "run"]


def test_an_unsupported_tokenizer_is_one_sentence(tmp_path, capsys):
    sentencepiece = {"model": {"type": "BPE", "byte_fallback": True}, "decoder": {"type": "Sequence"}}
    run = _fake_run(tmp_path, {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, sentencepiece)
    assert main(["export", str(run), "--out", str(tmp_path / "out"), "--gguf"]) == 1
    err = capsys.readouterr().err
    assert "tokenizer" in err and "SentencePiece-style BPE" in err and not (tmp_path / "out").exists()


def test_gguf_flags_that_do_not_fit(lora_run, tmp_path, capsys):
    assert main(["export", str(lora_run), "--out", str(tmp_path / "a"), "--gguf-type", "q8_0"]) == 1
    assert "add --gguf" in capsys.readouterr().err
    assert main(["export", str(lora_run), "--out", str(tmp_path / "b"), "--gguf", "--adapter"]) == 1
    assert "not --adapter" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_failure_while_writing_leaves_nothing_behind(lora_run, tmp_path, capsys, monkeypatch):
    import gguf

    written = []

    def disk_full(self, tensor, *args, **kwargs):
        if written:
            raise OSError(28, "No space left on device")
        written.append(tensor.nbytes)
        return original(self, tensor, *args, **kwargs)

    original = gguf.GGUFWriter.write_tensor_data
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", disk_full)
    out = tmp_path / "out"
    assert main(["export", str(lora_run), "--out", str(out), "--gguf"]) == 1
    err = capsys.readouterr().err
    assert "could not write the export" in err and "No space left" in err and "Traceback" not in err
    assert written and not out.exists() and os.listdir(tmp_path) == []  # no partial folder, no partial file


def test_a_checkpoint_as_gguf_for_the_service(lora_run, tmp_path):
    """gguf_of_run (the dashboard's download): merge a kept checkpoint in a temporary folder, convert, clean up."""
    import torch
    from transformers import AutoModelForCausalLM

    from finetune.data.prompting import prompt_ids
    from finetune.ship.export.gguf import gguf_of_run
    from finetune.ship.run_folder import checkpoint_steps, load_for_generation, locate_weights

    step = checkpoint_steps(lora_run)[0]
    target = gguf_of_run(lora_run, step, tmp_path / "step.gguf", "f32")
    assert os.listdir(tmp_path) == ["step.gguf"]  # the merged folder and the partial file are gone
    read = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=target.name, dtype=torch.float32)
    tuned, tokenizer = load_for_generation(locate_weights(lora_run, step))
    ids = torch.tensor([prompt_ids(tokenizer, [{"role": "user", "content": "Where is my order BR-1234?"}])])
    with torch.no_grad():
        assert (read(input_ids=ids).logits - tuned(input_ids=ids).logits).abs().max() <= BOUNDS["f32"]
    assert metadata(target)["general.name"] == lora_run.name
