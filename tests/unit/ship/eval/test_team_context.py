"""The team's voice bound to the team's context (`team_system`) and soft targets on replay rows (`replay_targets`):
what each puts where, what the plan, the card and the run's consumers show, and that off leaves the run as it was."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from replay_fixtures import counting_base
from rich.console import Console

from finetune.data import replay_mix
from finetune.data.read import read_file
from finetune.data.team_context import bound_conversation, with_team_system
from finetune.data.types import Message
from finetune.plan.render import render_plan
from finetune.run import plan_run, train
from finetune.settings.config import RunConfig
from finetune.settings.errors import ConfigError
from finetune.ship.run_folder import team_system_of
from finetune.train.objective import SoftReplaySFT, TokenNormalisedSFT, objective_for

SYSTEM = "You answer for Brightside Support."
PROMPTS = 6


@pytest.fixture
def calls(monkeypatch, tmp_path):
    monkeypatch.setattr(replay_mix, "training_prompts", lambda: replay_mix.replay_prompts()[:PROMPTS])
    return counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: "A plain general answer.")


def _plan(team: str, model: Path, out: Path, **settings):
    return plan_run(RunConfig(data=team, model=str(model), out=str(out), **settings), out, measure=False)


def _first_user(row: dict) -> str:
    return next(m["content"] for m in row["messages"] if m["role"] == "user")


def _rows(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def test_the_message_goes_first_where_a_conversation_has_none():
    asked = [{"role": "user", "content": "hi"}]
    assert with_team_system(asked, SYSTEM) == [{"role": "system", "content": SYSTEM}, *asked]
    own = [{"role": "system", "content": "Theirs."}, *asked]
    assert with_team_system(own, SYSTEM) == own  # a conversation's own system message is the team's context already
    assert with_team_system(asked, None) == asked
    conversations = read_file(str(Path(__file__).resolve().parents[4] / "examples" / "test.jsonl")).conversations
    without = next(c for c in conversations if c.messages[0].role != "system")
    assert bound_conversation(without, SYSTEM).messages == (Message("system", SYSTEM), *without.messages)
    with_own = next(c for c in conversations if c.messages[0].role == "system")
    assert bound_conversation(with_own, SYSTEM) == with_own


def test_team_conversations_get_it_after_the_split_and_validation_holds_the_same_conversations(
    team, toy_model, tmp_path, calls
):
    plain = _plan(team, toy_model, tmp_path / "plain")
    bound = _plan(team, toy_model, tmp_path / "bound", team_system=SYSTEM)
    assert bound.config.data == str(tmp_path / "bound" / "team" / "train.jsonl")
    train, val = _rows(bound.config.data), _rows(bound.config.val_file)
    assert all(row["messages"][0]["role"] == "system" for row in train + val)
    given = {_first_user(row): row for row in _rows(team)}
    for row in train + val:  # a system message of the team's own is kept; the others get the team's
        own = given[_first_user(row)]["messages"][0]
        assert row["messages"][0]["content"] == (own["content"] if own["role"] == "system" else SYSTEM)
    _, expected_val, _ = replay_mix.team_split(RunConfig(data=team, model=str(toy_model)))  # the data path's cut
    assert [_first_user(row) for row in val] == [next(m.content for m in c.messages if m.role == "user")
                                                 for c in expected_val]  # fmt: skip
    assert len(val) == plain.plan.data.validation_conversations == bound.plan.data.validation_conversations
    assert bound.plan.data.conversations == plain.plan.data.conversations
    assert bound.plan.to_dict()["team_system"] == SYSTEM and plain.plan.to_dict()["team_system"] is None
    assert plain.config.data == team  # unset: the run reads the user's file as before


def test_a_plan_without_an_output_folder_leaves_nothing_in_tmp(team, toy_model, tmp_path, calls, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    first = plan_run(RunConfig(data=team, model=str(toy_model), team_system=SYSTEM), None, measure=False)
    again = plan_run(RunConfig(data=team, model=str(toy_model), team_system=SYSTEM), None, measure=False)
    assert (
        Path(first.config.data).parent.parent == tmp_path / "cache" / "team" and first.config.data == again.config.data
    )
    assert not any(scratch.iterdir()) and first.plan.data.conversations > 0


def test_replay_rows_keep_the_templates_default_context(team, toy_model, tmp_path, calls):
    on = _plan(team, toy_model, tmp_path / "on", replay=0.25, team_system=SYSTEM)
    rows = _rows(on.config.data)
    team_rows = on.plan.replay_added["team_rows"]
    assert all(row["messages"][0]["role"] == "system" for row in rows[:team_rows])
    assert rows[team_rows:] and all(row["messages"][0]["role"] == "user" for row in rows[team_rows:])


def test_settings_say_what_is_wrong():
    with pytest.raises(ConfigError, match="empty"):
        RunConfig(team_system="  ")
    with pytest.raises(ConfigError, match="does not apply"):
        RunConfig(team_system=SYSTEM, method="dpo")
    with pytest.raises(ConfigError, match="needs .*replay.* on"):
        RunConfig(replay="off", replay_targets="soft")
    with pytest.raises(ConfigError, match="LoRA"):
        RunConfig(replay=0.25, replay_targets="soft", method="full")


def test_soft_targets_are_in_the_plan_and_choose_the_objective(team, toy_model, tmp_path, calls):
    soft = _plan(team, toy_model, tmp_path / "soft", replay=0.25, replay_targets="soft")
    text = _plan(team, toy_model, tmp_path / "text", replay=0.25)
    assert isinstance(objective_for(soft.plan), SoftReplaySFT)
    assert objective_for(soft.plan).team_rows == soft.plan.replay_added["team_rows"]
    assert type(objective_for(text.plan)) is TokenNormalisedSFT
    console = Console(file=io.StringIO(), width=300)
    render_plan(soft.plan, console)
    assert "soft targets: each replay answer token is trained toward the base model's" in console.file.getvalue()
    # the base's forward pass over the replay rows is in the time estimate, the bill unchanged
    assert soft.plan.tokens_processed == text.plan.tokens_processed
    assert soft.plan.cost.seconds > text.plan.cost.seconds


def test_a_run_with_both_trains_and_records_them(team, toy_model, tmp_path, calls):
    out = tmp_path / "run"
    config = RunConfig(data=team, model=str(toy_model), out=str(out), replay=0.25, replay_targets="soft",
                       team_system=SYSTEM, max_steps=3)  # fmt: skip
    result = train(config)
    assert result.report["final_weights"] and team_system_of(out) == SYSTEM
    card = (out / "adapter" / "README.md").read_text(encoding="utf-8")
    assert f"| the team's system message | {SYSTEM} (on every team conversation" in card
    assert "| replay rows trained toward | the base's whole next-token distribution (soft targets) |" in card
