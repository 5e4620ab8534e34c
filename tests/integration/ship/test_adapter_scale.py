"""Adapter scale on the toy model (issue 34): off and 1 write the same adapter byte for byte; a scale is written into
adapter_config.json (and into the output layer trained beside the adapter), the merged export computes exactly what
the scaled adapter computes, and the model measured in memory is the one written; auto measures every scale of its
grid on the team's validation set and on the general probe and keeps what the rule keeps."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from finetune.data.prompting import prompt_ids
from finetune.plan.render import render_plan
from finetune.report.summary import print_summary
from finetune.rules import replay as replay_rule
from finetune.rules.adapter_scale import GRID, choose_scale
from finetune.rules.forgetting import SHORT_RUN_STEPS
from finetune.run import plan_run, train
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.ship import adapter_scale
from finetune.ship.export.write import write_model
from finetune.ship.run_folder import load_for_generation, locate_weights

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
FEW = {"epochs": 1, "batch_size": 8, "max_seq_len": 512, "lr": 0.01, "max_steps": 6, "eval_every": 3}
PROMPT = [{"role": "user", "content": "Where is my order BR-1234? It has not arrived."}]
# the general probe: the base's own answers to held-out prompts; fixed here (the untrained toy rarely stops)
PROBE = [
    {"messages": [{"role": "user", "content": f"What colour could a {thing} be?"},
                  {"role": "assistant", "content": f"A {thing} could be blue, or any colour you like."}]}
    for thing in ("kite", "boat", "door", "cup", "hat", "car")
]  # fmt: skip


def _config(toy_model: Path, out: Path, **settings) -> RunConfig:
    return RunConfig(data=str(EXAMPLES / "train.jsonl"), model=str(toy_model), out=str(out), **{**FEW, **settings})


@pytest.fixture(scope="module")
def runs(toy_model, tmp_path_factory) -> dict:
    """The same six steps three times: adapter scale off, 1 and 0.5; and auto, over ten steps."""
    root = tmp_path_factory.mktemp("scale")
    done = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(adapter_scale, "base_answers", lambda config, tokenizer, held_out=False: PROBE)
        patch.setattr(replay_rule, "MIN_PARAMETERS", 0)  # Auto as on a real base (it leaves a toy's adapter alone)
        for name, scale in (("off", "off"), ("one", 1.0), ("half", 0.5)):
            done[name] = train(_config(toy_model, root / name, adapter_scale=scale))
        # Auto measures no scale for a smoke test (rules/forgetting.py): its run is just long enough not to be one
        done["auto"] = train(_config(toy_model, root / "auto", adapter_scale="auto", max_steps=SHORT_RUN_STEPS))
    return done


def _logits(model, tokenizer) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt_ids(tokenizer, PROMPT)])).logits[0]


def test_off_and_one_write_the_same_adapter_byte_for_byte(runs):
    off, one = runs["off"].out_dir / "adapter", runs["one"].out_dir / "adapter"
    for name in adapter_scale.ADAPTER_FILES:
        assert (off / name).read_bytes() == (one / name).read_bytes(), name
    assert "adapter_scale" not in runs["off"].report  # off: the report as it always was
    scale = runs["one"].report["adapter_scale"]
    assert scale["value"] == 1.0 and [m["alpha"] for m in scale["measured"]] == [0.0, 1.0]


def test_a_scale_is_written_into_the_adapter_config_and_the_trained_output_layer(runs, toy_model):
    off, half = runs["off"].out_dir / "adapter", runs["half"].out_dir / "adapter"
    config_off = json.loads((off / "adapter_config.json").read_text())
    config_half = json.loads((half / "adapter_config.json").read_text())
    assert config_half["lora_alpha"] == 0.5 * config_off["lora_alpha"]
    assert {k: v for k, v in config_half.items() if k != "lora_alpha"} == {
        k: v for k, v in config_off.items() if k != "lora_alpha"
    }
    trained, written = load_file(off / "adapter_model.safetensors"), load_file(half / "adapter_model.safetensors")
    assert trained.keys() == written.keys()
    heads = [key for key in trained if "lm_head" in key]
    assert heads  # Auto trains the toy's output layer beside the adapter
    base_head = load_file(toy_model / "model.safetensors")["lm_head.weight"]
    for key in trained:
        if key in heads:
            assert torch.allclose(written[key], base_head + 0.5 * (trained[key] - base_head), atol=1e-6)
        else:
            assert torch.equal(written[key], trained[key]), key  # the LoRA matrices are not touched


def test_the_merged_export_computes_what_the_scaled_adapter_computes(runs, tmp_path):
    scaled_model, tokenizer = load_for_generation(locate_weights(runs["half"].out_dir))
    expected = _logits(scaled_model, tokenizer)
    write_model(locate_weights(runs["half"].out_dir), tmp_path / "merged", "float32")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.allclose(_logits(merged, tokenizer), expected, atol=1e-5, rtol=0)
    unscaled, _ = load_for_generation(locate_weights(runs["off"].out_dir))
    assert (_logits(unscaled, tokenizer) - expected).abs().max() > 1e-3  # and it is another model than scale 1


def test_the_model_measured_in_memory_is_the_model_written(runs):
    """Auto measures through `scaled` on the trained model; loaded from its files, the scaled adapter is that model."""
    unscaled, tokenizer = load_for_generation(locate_weights(runs["off"].out_dir))
    written, _ = load_for_generation(locate_weights(runs["half"].out_dir))
    with adapter_scale.scaled(unscaled, 0.5):
        in_memory = _logits(unscaled, tokenizer)
    assert torch.allclose(in_memory, _logits(written, tokenizer), atol=1e-5, rtol=0)
    assert not torch.allclose(_logits(unscaled, tokenizer), in_memory, atol=1e-3)  # and everything was put back


def test_auto_measures_the_grid_and_keeps_what_the_rule_keeps(runs):
    report = runs["auto"].report
    scale = report["adapter_scale"]
    measured = scale["measured"]
    assert [m["alpha"] for m in measured] == [0.0, *GRID]
    assert all(m["val_loss"] is not None and m["general_loss"] is not None for m in measured)
    assert scale["value"] == choose_scale(measured).value and scale["reason"] == choose_scale(measured).reason
    # the validation loss at scale 1 is the run's own val_loss of its best checkpoint, measured the same way
    assert measured[-1]["val_loss"] == pytest.approx(report["best_val_loss"], rel=1e-5)
    assert len({round(m["general_loss"], 6) for m in measured}) == len(measured)  # each scale is another model
    assert scale["general_probe"]["records"] == len(PROBE) and scale["tolerance"] > 0
    config = json.loads((runs["auto"].out_dir / "adapter" / "adapter_config.json").read_text())
    trained = json.loads((runs["off"].out_dir / "adapter" / "adapter_config.json").read_text())
    assert config["lora_alpha"] == pytest.approx(scale["value"] * trained["lora_alpha"])


def test_the_report_card_and_summary_say_it(runs):
    card = (runs["half"].out_dir / "adapter" / "README.md").read_text()
    assert "## Adapter scale" in card and "base + 0.5 x the trained update" in card
    assert "| 0.5 |" in card and "(the base)" in card
    assert "## Adapter scale" not in (runs["off"].out_dir / "adapter" / "README.md").read_text()
    console = Console(file=io.StringIO(), width=300)
    print_summary(runs["half"].report, console=console)
    text = console.file.getvalue()
    assert "adapter scale" in text and "0.5: set for this run" in text and "(at 1:" in text


def test_the_plan_says_auto_chooses_it_after_training_and_off_leaves_the_plan_alone(toy_model, tmp_path, monkeypatch):
    toy = plan_run(_config(toy_model, tmp_path / "toy"), tmp_path / "toy", measure=False)  # Auto's, by default
    assert toy.plan.to_dict()["adapter_scale"] == "off" and toy.plan.auto["adapter_scale"].startswith("off: a model")
    monkeypatch.setattr(replay_rule, "MIN_PARAMETERS", 0)  # Auto as on a real base
    auto = plan_run(
        _config(toy_model, tmp_path / "auto", adapter_scale="auto", max_steps=SHORT_RUN_STEPS), tmp_path / "auto",
        measure=False,
    )  # fmt: skip
    off = plan_run(_config(toy_model, tmp_path / "off", adapter_scale="off"), tmp_path / "off", measure=False)
    assert "chosen after training" in auto.plan.auto["adapter_scale"]
    assert "adapter_scale" not in off.plan.auto and off.plan.to_dict()["adapter_scale"] == "off"
    shown = {}
    for name, planned in (("auto", auto), ("off", off)):
        console = Console(file=io.StringIO(), width=300)
        render_plan(planned.plan, console)
        shown[name] = console.file.getvalue()
    assert "Adapter scale" in shown["auto"] and "adapter_scale: chosen after training" in shown["auto"]
    assert "Adapter scale" not in shown["off"]


def test_full_fine_tuning_with_auto_keeps_its_weights_and_says_why(toy_model, tmp_path):
    planned = plan_run(_config(toy_model, tmp_path, method="full", adapter_scale="auto"), tmp_path, measure=False)
    scale = adapter_scale.scale_adapter(None, None, planned.plan, None, [], 0, tmp_path, torch.device("cpu"))
    assert scale["value"] == 1.0 and "no adapter to scale" in scale["reason"] and scale["measured"] == []
    assert planned.plan.to_dict()["adapter_scale"] is None  # a LoRA setting: null in a full run's plan
    assert "no adapter to scale" in planned.plan.auto["adapter_scale"]  # and the plan says why nothing happens


def test_resume_refuses_a_change_of_the_scale(toy_model, tmp_path):
    train(_config(toy_model, tmp_path, max_steps=2))  # two steps, adapter scale off
    with pytest.raises(UserError, match="adapter scale changed"):
        train(_config(toy_model, tmp_path, max_steps=4, resume=True, adapter_scale=0.5))
