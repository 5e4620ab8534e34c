"""The forgetting curve on the toy model: held-out general prompts answered by the base (generated once, cached),
scored at every evaluation beside validation and once before the first step; shown in the plan, the metrics, the
plot and the report; refused as a change on resume; and `off` leaving the run exactly as it was."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from replay_fixtures import counting_base
from rich.console import Console

from finetune.data import replay_mix
from finetune.plan.render import render_plan
from finetune.report.metrics import read_metrics
from finetune.run import plan_run, train
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import check_resume, run_fingerprint
from finetune.ship.eval import general_val, replay

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
TODAY = {"step", "epoch", "learning_rate", "train_loss", "grad_norm", "target_tokens", "tokens_per_s", "val_loss"}
RUN = {"max_steps": 6, "eval_every": 2, "epochs": 1, "batch_size": 4, "gpu": "cpu"}
PLANNED = RUN | {"max_steps": 12}  # a plan past a smoke test's length (rules/forgetting.py SHORT_RUN_STEPS)
HELD_OUT_BATCHES = -(-len(replay_mix.held_out_prompts()) // replay.CHUNK)  # the base answers CHUNK at a time


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """The base's answers are a sentence about the prompt; its loads and generations counted (conftest.py)."""
    return counting_base(
        monkeypatch, tmp_path / "cache", lambda prompt: f"Here is a plain answer: {prompt[:40].lower()}"
    )


def _train(team: str, model: Path, out: Path, **settings):
    return train(RunConfig(data=team, model=str(model), out=str(out), **(RUN | settings)))


def _plan(team: str, model: Path, out: Path, **settings):
    return plan_run(RunConfig(data=team, model=str(model), out=str(out), **settings), out, measure=False)


def _same_run(plan) -> dict:
    """plan.json but its output folder and its cost (the machine knows its speed after the first run)."""
    document = {k: v for k, v in plan.to_dict().items() if k != "cost"}
    return document | {"settings": {k: v for k, v in document["settings"].items() if k != "out"}}


def _evaluated(rows: list[dict], key: str) -> list[int]:
    return [r["step"] for r in rows if key in r]


def test_off_is_todays_run(team, toy_model, tmp_path, calls, monkeypatch):
    import finetune.run as run_module

    off = _train(team, toy_model, tmp_path / "off")  # general_val auto: off while replay is off
    rows = read_metrics(tmp_path / "off" / "metrics.jsonl")
    assert set().union(*rows) == TODAY and "forgetting" not in off.report
    assert calls["generate"] == calls["load"] == 0 and not (tmp_path / "cache" / "replay").exists()
    assert off.plan.general_val is False and off.plan.general_val_set is None and "general_val" in off.plan.auto
    # the spine without the curve's step at all: the same plan, the same training
    monkeypatch.setattr(run_module, "_general_val", lambda plan, *_rest, **_given: (plan, None))
    before = _train(team, toy_model, tmp_path / "before")
    assert _same_run(before.plan) == _same_run(off.plan)
    rows_before = read_metrics(tmp_path / "before" / "metrics.jsonl")
    assert [list(r) for r in rows_before] == [list(r) for r in rows]
    assert [r["train_loss"] for r in rows_before] == [r["train_loss"] for r in rows]


def test_on_logs_the_curve_at_every_evaluation_and_never_changes_training(team, toy_model, tmp_path, calls):
    off = _train(team, toy_model, tmp_path / "off", general_val=False)
    on = _train(team, toy_model, tmp_path / "on", general_val=True)
    rows_off, rows = read_metrics(tmp_path / "off" / "metrics.jsonl"), read_metrics(tmp_path / "on" / "metrics.jsonl")
    assert calls["load"] == 1 and calls["generate"] == HELD_OUT_BATCHES
    # the same steps, losses and validation: the curve only reads the model
    for a, b in zip(rows, rows_off, strict=True):
        assert a["train_loss"] == b["train_loss"] and a.get("val_loss") == b.get("val_loss")
    assert set().union(*rows) - TODAY == {"general_val_loss", "general_val_loss_base"}
    assert _evaluated(rows, "general_val_loss") == _evaluated(rows, "val_loss") == [2, 4, 6]
    assert _evaluated(rows, "general_val_loss_base") == [1]  # measured before the first step
    assert "forgetting" in on.report and "forgetting" not in off.report
    # plan.json says what it costs
    about = json.loads((tmp_path / "on" / "plan.json").read_text())["general_val_set"]
    assert about["records"] == about["answers"] == len(replay_mix.held_out_prompts()) == about["prompts"]
    assert about["evaluations"] == 4 and about["tokens_read"] == 4 * about["tokens"] and about["billed"] is False
    assert about["cached"] is False and about["source"] == "base model"


def test_the_base_value_is_the_base_models_loss_on_its_answers(team, toy_model, tmp_path, calls):
    from finetune.data.tokenize import load_tokenizer
    from finetune.train.batching import pad_batch
    from finetune.train.cross_entropy import nll_sum
    from finetune.train.model import model_for

    on = _train(team, toy_model, tmp_path / "on", general_val=True)
    tokenizer = load_tokenizer(str(toy_model))
    records, _ = general_val.general_val_set(on.plan, tokenizer)  # from the cache now
    assert calls["generate"] == HELD_OUT_BATCHES
    model = model_for(on.plan, torch.device("cpu"), len(tokenizer)).eval()  # the adapter starts at zero: the base
    with torch.no_grad():
        total = sum(float(nll_sum(model, pad_batch([r], tokenizer.pad_token_id or 0))) for r in records)
    expected = total / sum(r.num_targets for r in records)
    base = read_metrics(tmp_path / "on" / "metrics.jsonl")[0]["general_val_loss_base"]
    assert base == pytest.approx(expected, rel=1e-4)


def test_the_report_and_the_plot_read_the_curve(team, toy_model, tmp_path, calls):
    from matplotlib.image import imread

    from finetune.report.plot import GENERAL_COLOR

    on = _train(team, toy_model, tmp_path / "on", general_val=True)
    rows = read_metrics(tmp_path / "on" / "metrics.jsonl")
    general = [(r["step"], r["general_val_loss"]) for r in rows if "general_val_loss" in r]
    f = json.loads((tmp_path / "on" / "report.json").read_text())["forgetting"]
    assert f == on.report["forgetting"]
    assert f["general_val_loss_start"] == rows[0]["general_val_loss_base"] and f["start_step"] == 0
    assert (f["end_step"], f["general_val_loss_end"]) == general[-1]
    assert f["change"] == pytest.approx(general[-1][1] - rows[0]["general_val_loss_base"])
    assert f["evaluations"] == 3 and f["best_step"] == on.report["best_step"]
    assert f["fit_step"] in (2, 4, 6) and f["message"].startswith("The team's replies fit from step")
    image = imread(tmp_path / "on" / "loss_curve.png")[..., :3]
    colour = torch.tensor([int(GENERAL_COLOR[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    assert int(((torch.from_numpy(image.copy()) - colour).abs().amax(dim=-1) < 0.02).sum()) > 100  # the curve


def test_the_plan_says_it_is_on_with_replay_and_what_it_costs(team, toy_model, tmp_path, calls):
    planned = _plan(team, toy_model, tmp_path / "a", replay=0.25, **PLANNED)
    assert planned.plan.general_val is True and "self-replay is on" in planned.plan.auto["general_val"]
    assert len(planned.general_val) == len(replay_mix.held_out_prompts())
    console = Console(file=io.StringIO(), width=400)
    render_plan(planned.plan, console)
    text = console.file.getvalue()
    held = len(replay_mix.held_out_prompts())
    assert (
        f"Forgetting the base model's answers to {held} held-out general prompts, never trained on ({held} finished)"
        in text
    )
    assert "not billed" in text and "generated once for this base" in text
    again = _plan(team, toy_model, tmp_path / "b", replay=0.25, **PLANNED)
    assert calls["generate"] == 1 + HELD_OUT_BATCHES  # the training slice and the held-out slice, once; then the cache
    assert again.plan.general_val_set["cached"] is True
    console = Console(file=io.StringIO(), width=400)
    render_plan(again.plan, console)
    assert "read from the cache" in console.file.getvalue()


def test_the_held_out_prompts_are_never_trained_on(team, toy_model, tmp_path, calls):
    planned = _plan(team, toy_model, tmp_path / "a", replay=10, **PLANNED)
    held = {p.text for p in replay_mix.held_out_prompts()}
    mixed = (tmp_path / "a" / "replay" / "train.jsonl").read_text(encoding="utf-8")
    trained = [json.loads(line)["messages"][0]["content"] for line in mixed.splitlines()]
    assert held and not held & set(trained) and not any(text in mixed for text in held)
    replayed = set(trained) & {p.text for p in replay_mix.training_prompts()}  # ratio 10: most training prompts
    assert len(replayed) == planned.plan.replay_added["distinct_rows"] > 200
    # the curve's records are the held-out prompts, and only them
    decoded = [planned.tokenizer.decode(r.input_ids) for r in planned.general_val]
    assert all(any(text in d for text in held) for d in decoded) and len(decoded) == len(held)


def test_a_change_of_the_curve_is_refused_on_resume_unless_allowed(team, toy_model, tmp_path, calls):
    off = _plan(team, toy_model, tmp_path / "a", general_val=False, **RUN)
    on = _plan(team, toy_model, tmp_path / "b", general_val=True, **RUN)
    saved, now = run_fingerprint(off.plan), run_fingerprint(on.plan)
    with pytest.raises(UserError, match="forgetting curve changed"):
        check_resume(saved, now, None, "checkpoint-4")
    assert [c.key for c in check_resume(saved, now, "general_val", "checkpoint-4")] == ["general_val"]
    older = {k: v for k, v in saved.items() if k != "general_val"}  # a checkpoint from before the setting
    assert check_resume(older, now, None, "checkpoint-4") == []


def test_settings_say_what_is_wrong():
    assert RunConfig().general_val == "auto"
    assert RunConfig(general_val="on").general_val is True and RunConfig(general_val="off").general_val is False
    with pytest.raises(UserError, match="does not apply"):
        RunConfig(general_val=True, method="dpo")
    assert RunConfig(method="dpo", general_val=False).general_val is False


def test_auto_turns_the_curve_on_when_replay_draws_on_the_base():
    from finetune.rules.forgetting import auto_general_val

    assert auto_general_val(replay=True, general_data=False, objective="sft").value is True
    assert auto_general_val(replay=False, general_data=False, objective="sft").value is False
    off = auto_general_val(replay=True, general_data=True, objective="sft")  # nothing is generated for replay then
    assert off.value is False and "your general conversations" in off.reason
    assert auto_general_val(replay=True, general_data=False, objective="dpo").value is False


def test_the_plan_line_counts_what_the_record_limit_did():
    from finetune.plan.render import _general_val_line

    about = {
        "prompts": 43, "answers": 28, "records": 27, "shortened": 1, "left_out": 1, "tokens": 3439, "evaluations": 13,
        "seconds": 80.2, "cached": False, "generation_s": 548.4,
    }  # fmt: skip
    line = _general_val_line(about)
    assert "answers to 43 held-out general prompts, never trained on (28 finished, 1 left out as longer than " in line
    assert "1 shortened to it): 27 records, 3,439 tokens read at each of 13 evaluations" in line
    assert "about 80 s in all, not billed; the base's answers generated once for this base in 9 min (cached)" in line


def test_a_smoke_test_generates_nothing_general(team, toy_model, tmp_path, calls, monkeypatch):
    from finetune.rules import replay as replay_rule

    monkeypatch.setattr(replay_rule, "MIN_PARAMETERS", 0)  # Auto's rules as on a real base (the toy is below it)
    smoke = _plan(team, toy_model, tmp_path / "smoke", max_steps=2, batch_size=2)
    assert smoke.plan.general_val is False and "smoke test" in smoke.plan.auto["general_val"]
    assert smoke.plan.run.adapter_scale == "off" and "smoke test" in smoke.plan.auto["adapter_scale"]
    asked = calls["asked"]
    assert smoke.plan.replay_added["generated"]["prompts"] == len(asked) <= 32  # one chunk, for its few rows
    assert not set(asked) & {p.text for p in replay_mix.held_out_prompts()}
