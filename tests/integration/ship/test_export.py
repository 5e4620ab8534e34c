"""`finetune export`: merged folders load without peft and answer like adapter-on-base; adapters travel; cards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from finetune.commands.cli import main
from finetune.data.prompting import end_of_turn_id, prompt_ids
from finetune.ship.run_folder import load_for_generation, locate_weights

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

PROMPT = [{"role": "user", "content": "Where is my order BR-1234? It has not arrived."}]

# loads the folder with peft made unimportable, prints logits and a greedy answer as JSON
NO_PEFT_SCRIPT = """
import json, sys
sys.modules["peft"] = None
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = torch.tensor([json.loads(sys.argv[2])])
with torch.no_grad():
    logits = model(input_ids=ids).logits[0].tolist()
    answer = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
print(json.dumps({"logits": logits, "answer": answer[0, ids.shape[1]:].tolist(),
                  "eos": model.generation_config.eos_token_id}))
"""


def _greedy(model, ids: list[int], eos) -> list[int]:
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def test_merged_export_loads_without_peft_and_matches_the_adapter(lora_run, tmp_path):
    out = tmp_path / "merged"
    assert main(["export", str(lora_run), "--out", str(out)]) == 0
    assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()

    tuned, tokenizer = load_for_generation(locate_weights(lora_run))
    ids = prompt_ids(tokenizer, PROMPT)
    eot = end_of_turn_id(tokenizer)
    with torch.no_grad():
        expected = tuned(input_ids=torch.tensor([ids])).logits[0]
    result = subprocess.run(
        [sys.executable, "-c", NO_PEFT_SCRIPT, str(out), json.dumps(ids)],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        check=True,
    )
    loaded = json.loads(result.stdout)
    assert torch.allclose(torch.tensor(loaded["logits"]), expected, atol=1e-5, rtol=0)
    assert loaded["eos"] == eot  # the generation config stops at the end of turn
    assert loaded["answer"] == _greedy(tuned, ids, eot)

    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.chat_template == tokenizer.chat_template
    assert prompt_ids(reloaded, PROMPT) == ids


def test_the_adapter_changed_the_model(lora_run, toy_model):
    """Guard for the equality above: the adapter is not a no-op, so merged == adapter says something."""
    from transformers import AutoModelForCausalLM

    tuned, tokenizer = load_for_generation(locate_weights(lora_run))
    ids = torch.tensor([prompt_ids(tokenizer, PROMPT)])
    base = AutoModelForCausalLM.from_pretrained(toy_model)
    with torch.no_grad():
        assert (tuned(input_ids=ids).logits - base(input_ids=ids).logits).abs().max() > 1e-2


def test_model_card_is_real(lora_run, tmp_path):
    out = tmp_path / "merged"
    assert main(["export", str(lora_run), "--out", str(out), "--dtype", "bfloat16"]) == 0
    card = (out / "README.md").read_text()
    plan = json.loads((lora_run / "plan.json").read_text())
    report = json.loads((lora_run / "report.json").read_text())
    assert "[More Information Needed]" not in card
    assert str(locate_weights(lora_run).base) in card
    assert f"| LoRA rank | {plan['lora_rank']} | {plan['auto']['lora_rank']} |" in card
    assert f"| best step | {report['best_step']} |" in card
    assert report["diagnosis"]["message"] in card
    assert f"| training conversations | {plan['conversations']:,} |" in card
    held_out = json.loads((lora_run / "test_split.json").read_text())["conversations"]
    assert f"| test conversations (held out before training) | {held_out} |" in card
    # the fixture gives --lr and --batch-size: the card says they were set, not chosen by Auto
    assert f"| learning rate | {plan['learning_rate']:.4g} | set for this run (not chosen by Auto) |" in card
    assert f"| epochs | {plan['epochs']} | set for this run (not chosen by Auto) |" in card
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16"


def test_adapter_export_resolves_its_base_from_anywhere(lora_run, tmp_path, monkeypatch):
    out = tmp_path / "adapter"
    assert main(["export", str(lora_run), "--out", str(out), "--adapter"]) == 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]).is_absolute()
    card = (out / "README.md").read_text()
    assert "library_name: peft" in card and "[More Information Needed]" not in card

    monkeypatch.chdir(tmp_path)  # somewhere unrelated to where the run was trained
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(str(out))
    tuned, tokenizer = load_for_generation(locate_weights(lora_run))
    ids = torch.tensor([prompt_ids(tokenizer, PROMPT)])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, tuned(input_ids=ids).logits, atol=1e-6)


def test_checkpoint_export_and_refusals(lora_run, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(lora_run), "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    assert sorted(os.listdir(out)) == ["keep.txt"]

    assert main(["export", str(lora_run), "--out", str(tmp_path / "nope"), "--checkpoint", "999"]) == 1
    assert "no checkpoint at step 999" in capsys.readouterr().err

    step3 = tmp_path / "step3"
    assert main(["export", str(lora_run), "--out", str(step3), "--checkpoint", "3", "--adapter"]) == 0
    assert "checkpoint of step 3" in (step3 / "README.md").read_text()


def test_an_unwritable_out_is_said_plainly(lora_run, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["export", str(lora_run), "--out", str(blocker / "exported")]) == 1
    err = capsys.readouterr().err
    assert "cannot create" in err and str(blocker / "exported") in err and "Traceback" not in err
    assert blocker.read_text() == "not a folder"


def test_exported_files_are_readable_like_any_new_file(lora_run, tmp_path):
    """safetensors writes 0600 files; an export is meant to be shared (teammates, a serving container)."""
    previous = os.umask(0o022)
    try:
        assert main(["export", str(lora_run), "--out", str(tmp_path / "shared")]) == 0
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "shared").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


def test_export_keeps_the_saved_dtype_unless_told(tmp_path):
    from finetune.ship.export.write import saved_dtype

    folder = tmp_path / "bf16"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    assert saved_dtype(str(folder)) == "bfloat16"
    (folder / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))  # older transformers' key
    assert saved_dtype(str(folder)) == "float16"
    assert saved_dtype("nobody/not-in-the-cache") == "float32"
    assert saved_dtype(str(tmp_path / "missing")) == "float32"


def test_full_run_exports_as_is(full_run, tmp_path, capsys):
    from safetensors.torch import load_file

    out = tmp_path / "full"
    assert main(["export", str(full_run), "--out", str(out)]) == 0
    exported, trained = load_file(out / "model.safetensors"), load_file(full_run / "model" / "model.safetensors")
    assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)
    assert "every weight of the base fine-tuned" in (out / "README.md").read_text()
    assert main(["export", str(full_run), "--out", str(tmp_path / "a"), "--adapter"]) == 1
    assert "no adapter" in capsys.readouterr().err
