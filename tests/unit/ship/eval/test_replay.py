"""Self-replay on the toy model: answers generated once and cached, mixed in as targets on the training side only,
shown in the plan, refused as a change on resume, and `off` leaving the run exactly as it was."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from replay_fixtures import counting_base
from rich.console import Console

from finetune.data import replay_mix
from finetune.data.invented import scan_replies, summarize
from finetune.data.read import read_file
from finetune.plan.render import render_plan
from finetune.rules import replay as replay_rule
from finetune.run import plan_run, train
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import check_resume, run_fingerprint
from finetune.ship.eval import replay

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
PROMPTS = 6  # the tests answer a few of the shipped prompts, not all of them


@pytest.fixture
def calls(monkeypatch, tmp_path):
    """Few prompts; the answers a fixed sentence, so caching and mixing are tested on answers the product keeps;
    every model load and generate call counted (conftest.py)."""
    monkeypatch.setattr(replay_mix, "training_prompts", lambda: replay_mix.replay_prompts()[:PROMPTS])
    return counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: "A plain general answer.", every_load=True)


def _plan(team: str, model: Path, out: Path, **settings):
    config = RunConfig(data=team, model=str(model), out=str(out), **settings)
    return plan_run(config, out, measure=False)


def test_answers_are_generated_once_per_base_and_cached(team, toy_model, tmp_path, calls):
    # the forgetting curve (on with replay; its own slice, tests/unit/ship/eval/test_general_val.py) left aside
    first = _plan(team, toy_model, tmp_path / "a", replay=0.25, general_val=False)
    assert calls["generate"] == calls["load"] == 1
    cached = list((tmp_path / "cache" / "replay").glob("*.jsonl"))
    assert len(cached) == 1 and len(cached[0].read_text().splitlines()) == PROMPTS
    second = _plan(team, toy_model, tmp_path / "b", replay=0.25, general_val=False)
    assert calls["generate"] == calls["load"] == 1  # read from the cache: no model loaded, nothing generated
    generated = first.plan.replay_added.pop("generated"), second.plan.replay_added.pop("generated")
    assert first.plan.replay_added == second.plan.replay_added
    assert generated[0] | {"seconds": 0} == {"prompts": PROMPTS, "answered_now": PROMPTS, "from_cache": 0,
                                             "finished": PROMPTS, "seconds": 0}  # fmt: skip
    assert generated[1] == {"prompts": PROMPTS, "answered_now": 0, "from_cache": PROMPTS, "finished": PROMPTS,
                            "seconds": 0}  # fmt: skip


def test_replay_rows_are_targets_on_the_training_side_only(team, toy_model, tmp_path, calls):
    off = _plan(team, toy_model, tmp_path / "off")
    on = _plan(team, toy_model, tmp_path / "on", replay=0.25)
    added = on.plan.replay_added
    team_rows = off.plan.data.conversations  # the training side's
    assert added["team_rows"] == team_rows and added["rows"] == round(0.25 * team_rows)
    assert on.plan.data.conversations == team_rows + added["rows"]
    assert on.plan.data.validation_conversations == off.plan.data.validation_conversations > 0
    assert added["billed"] is False and added["source"] == "base model"
    # the bill is the team's file x epochs (the seeds' definition); the replay rows are trained on, not billed
    assert on.plan.tokens_processed == (on.plan.data.tokens_in_file - added["tokens"]) * on.plan.epochs
    assert on.plan.tokens_processed == off.plan.tokens_processed == on.plan.cost.billed_tokens
    assert on.plan.tokens_trained == on.plan.data.tokens_in_file * on.plan.epochs
    assert on.plan.tokens_trained == on.plan.tokens_processed + added["tokens_processed"]
    # validation is the team's own, exactly as without replay
    assert [r.input_ids for r in on.prepared.val] == [r.input_ids for r in off.prepared.val]
    assert on.plan.data.tokens_in_file == off.plan.data.tokens_in_file + added["tokens"]
    replayed = [r for r in on.prepared.train if r.line > team_rows]
    assert len(replayed) == added["rows"]
    for record in replayed:
        targets = [t for t, w in zip(record.input_ids, record.weights, strict=True) if w > 0]
        assert "A plain general answer." in on.tokenizer.decode(targets)


def test_the_plan_shows_replay_rows_and_tokens(team, toy_model, tmp_path, calls, monkeypatch):
    monkeypatch.setattr(replay_rule, "MIN_PARAMETERS", 0)  # Auto's rule as on a real base (the toy is below it)
    on = _plan(team, toy_model, tmp_path / "on", replay="auto")
    document = on.plan.to_dict()
    assert document["replay"] == "auto" and document["replay_added"]["ratio"] == replay_rule.AUTO_RATIO
    assert document["replay_added"]["tokens"] > 0 and "bench/AUTO.md" in document["auto"]["replay"]
    console = Console(file=io.StringIO(), width=200)
    render_plan(on.plan, console)
    text = console.file.getvalue()
    assert f"Replay     {document['replay_added']['rows']} general rows" in text and "not billed" in text
    team_tokens = document["tokens_in_file"] - document["replay_added"]["tokens"]
    assert f"Tokens     {team_tokens:,} in your file x {document['epochs']} epochs = " in text


def test_auto_leaves_replay_off_on_a_model_too_small_to_know_anything(team, toy_model, tmp_path, calls):
    toy = _plan(team, toy_model, tmp_path / "toy")  # replay is Auto's by default
    assert toy.config.replay == "auto" and toy.plan.replay_added is None and calls["generate"] == calls["load"] == 0
    assert toy.plan.auto["replay"].startswith("off: a model of ") and not (tmp_path / "toy" / "replay").exists()


def test_replay_off_leaves_the_run_as_it_was(team, toy_model, tmp_path, calls, monkeypatch):
    import finetune.run as run_module

    off = _plan(team, toy_model, tmp_path / "off", replay="off")
    monkeypatch.setattr(run_module, "_replayed", lambda config, *rest: (config, None))
    before = _plan(team, toy_model, tmp_path / "off", replay="off")  # the spine without the replay step at all
    assert calls["generate"] == calls["load"] == 0 and not (tmp_path / "off" / "replay").exists()
    assert off.config.data == team and off.plan.replay_added is None
    assert off.plan.to_dict() == before.plan.to_dict()
    assert (off.plan.total_steps, off.plan.tokens_processed) == (before.plan.total_steps, before.plan.tokens_processed)


def test_a_change_of_replay_is_refused_on_resume(team, toy_model, tmp_path, calls):
    off = _plan(team, toy_model, tmp_path / "off", replay="off")
    on = _plan(team, toy_model, tmp_path / "on", replay=0.25)
    saved = run_fingerprint(off.plan)
    now = dataclasses.replace(on.plan, run=dataclasses.replace(on.plan.run, data=team, val_file=None))
    with pytest.raises(UserError, match="self-replay changed"):
        check_resume(saved, run_fingerprint(now), "data", "checkpoint-10")
    assert check_resume(run_fingerprint(on.plan), run_fingerprint(on.plan), None, "checkpoint-10") == []


def test_a_teams_general_data_is_used_instead_of_the_base(team, toy_model, tmp_path, calls):
    general = tmp_path / "general.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"Name a colour {i}."}, {"role": "assistant", "content": "Blue."}]}
            for i in range(5)]  # fmt: skip
    general.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    on = _plan(team, toy_model, tmp_path / "on", replay=0.5, general_data=str(general))
    assert calls["generate"] == calls["load"] == 0
    assert on.plan.replay_added["source"] == str(general) and on.plan.replay_added["distinct_rows"] == 5


def test_settings_say_what_is_wrong():
    assert RunConfig().replay == "auto" and RunConfig(replay=False).replay == "off"  # YAML's bare `off`
    assert RunConfig(replay="0.5").replay == 0.5
    for bad, said in ((0, "above 0"), ("many", "a number or 'auto', or 'off'")):
        with pytest.raises(UserError, match=said):
            RunConfig(replay=bad)
    with pytest.raises(UserError, match="is mixed in by replay"):
        RunConfig(general_data="general.jsonl", replay="off")
    with pytest.raises(UserError, match="does not apply"):
        RunConfig(replay=0.5, method="dpo")
    assert RunConfig(method="dpo").replay == "auto"  # Auto leaves it off for preference tuning (rules/replay.py)


def test_the_run_bills_the_teams_tokens_and_trains_on_the_replay_rows_too(team, toy_model, tmp_path, calls):
    run = {"replay": 0.5, "general_val": False, "adapter_scale": "off", "epochs": 1, "batch_size": 4, "gpu": "cpu"}
    off = train(RunConfig(data=team, model=str(toy_model), out=str(tmp_path / "off"), **(run | {"replay": "off"})))
    on = train(RunConfig(data=team, model=str(toy_model), out=str(tmp_path / "on"), **run))
    added = on.plan.replay_added
    # the whole run: billed what the same run without replay is billed, the team's file x epochs
    assert on.report["tokens_processed"] == off.report["tokens_processed"] == on.plan.tokens_processed
    assert on.report["tokens_match"] is True
    assert on.report["tokens_trained"] == on.plan.tokens_trained == on.plan.tokens_processed + added["tokens_processed"]
    assert off.report["tokens_trained"] == off.report["tokens_processed"]
    # cut short: the team's tokens of the steps taken, as the plan said
    cut = train(RunConfig(data=team, model=str(toy_model), out=str(tmp_path / "cut"), max_steps=2, **run))
    assert cut.report["tokens_match"] is True and 0 < cut.report["tokens_processed"] < cut.report["tokens_trained"]


def test_auto_sizes_passes_and_batch_by_the_teams_records_whatever_replay_adds(team, toy_model, tmp_path, calls):
    off = _plan(team, toy_model, tmp_path / "off", replay="off")
    on = _plan(team, toy_model, tmp_path / "on", replay=3.0)  # 48 team rows (4 passes under 100) + 3 x as many
    assert on.plan.data.examples > 100 > off.plan.data.examples
    assert (on.plan.epochs, on.plan.effective_batch) == (off.plan.epochs, off.plan.effective_batch)
    assert on.plan.auto["epochs"] == off.plan.auto["epochs"]


def test_the_base_answers_only_as_many_prompts_as_the_run_trains_on(team, toy_model, tmp_path, monkeypatch):
    """A chunk at a time until enough answers finished: an unfinished answer does not count, and the next run on
    the same base answers only the prompts never asked."""
    monkeypatch.setattr(replay_mix, "training_prompts", lambda: replay_mix.replay_prompts()[:40])
    monkeypatch.setattr(replay, "CHUNK", 4)
    calls = counting_base(monkeypatch, tmp_path / "cache", lambda prompt: "" if "poem" in prompt else "An answer.")
    small = _plan(team, toy_model, tmp_path / "small", replay=0.1, general_val=False).plan.replay_added
    asked = list(calls["asked"])
    assert small["rows"] == round(0.1 * small["team_rows"])
    assert small["generated"]["prompts"] == len(asked) < 40 and len(asked) % 4 == 0
    assert small["generated"]["finished"] == sum("poem" not in p for p in asked) >= small["rows"]
    more = _plan(team, toy_model, tmp_path / "more", replay=0.5, general_val=False).plan.replay_added
    assert more["generated"]["from_cache"] == len(asked)  # read, not answered again
    assert calls["asked"][: len(asked)] == asked and not set(calls["asked"][len(asked) :]) & set(asked)
    assert more["generated"]["finished"] >= more["rows"] or more["generated"]["prompts"] == 40


def test_a_run_cut_by_max_steps_gets_the_replay_rows_its_steps_read(team, toy_model, tmp_path, calls, monkeypatch):
    monkeypatch.setattr(replay, "CHUNK", 2)
    smoke = _plan(team, toy_model, tmp_path / "smoke", replay=0.5, general_val=False, max_steps=2, batch_size=2)
    added = smoke.plan.replay_added
    assert added["rows"] == round(0.5 * 2 * 2) == 2 and added["generated"]["prompts"] == 2  # 4 team rows read at most
    assert smoke.plan.total_steps == 2


def test_invented_specifics_count_the_teams_replies_alone_by_the_teams_lines(team, toy_model, tmp_path, monkeypatch):
    """The base's replay answers are the product's rows, not the team's: a specific one of them states is not the
    team's to fix, and the warning names the team's file and lines, never the mixed copy's."""
    counting_base(monkeypatch, tmp_path / "cache", lambda prompt: "It costs $41.17 and ships on March 3.")
    config = RunConfig(data=team, model=str(toy_model), out=str(tmp_path / "run"), replay=1.0, max_steps=12)
    planned = plan_run(config, tmp_path / "run", measure=False)
    conversations = read_file(team).conversations
    replies = sum(1 for c in conversations for m in c.messages if m.role == "assistant" and m.weight > 0)
    team_only = summarize(scan_replies(conversations), "team.jsonl", replies)
    assert planned.plan.replay_added["rows"] > 0  # the base's answers were mixed in, each stating an amount and date
    assert planned.plan.data.invented_specifics == team_only
