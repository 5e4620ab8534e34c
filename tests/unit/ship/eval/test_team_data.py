"""One reader of the team's replies (issue 47, ship/eval/team_data.py): with a test split held out and replay on, the
recitation check and the team's voice read the team's training conversations alone, never the base's replay answers,
and name each by the team's file and its line there, not by a line of the run's copies."""

from __future__ import annotations

import json

import pytest
from replay_fixtures import counting_base

from finetune.data import replay_mix
from finetune.data.read import read_file
from finetune.run import plan_run
from finetune.settings.config import RunConfig
from finetune.ship.eval.grounding import training_replies_of
from finetune.ship.eval.team_data import team_training
from finetune.ship.eval.team_voice import team_replies

BASE_ANSWER = "A plain general answer, the same for every request."


@pytest.fixture
def run(team, toy_model, tmp_path, monkeypatch):
    """A planned run of the team's file: a test split held out, then replay rows the base answered mixed in."""
    monkeypatch.setattr(replay_mix, "training_prompts", lambda: replay_mix.replay_prompts()[:6])
    counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: BASE_ANSWER)
    out = tmp_path / "run"
    config = RunConfig(data=team, model=str(toy_model), out=str(out), replay=0.25, general_val=False,
                       test_fraction=0.25, val_fraction=0.1)  # fmt: skip
    planned = plan_run(config, out, measure=False)
    (out / "plan.json").write_text(json.dumps(planned.plan.to_dict()))
    assert planned.plan.replay_added["rows"] > 0 and BASE_ANSWER in (out / "replay" / "train.jsonl").read_text()
    return out


def test_the_teams_replies_are_its_own_rows_named_by_its_file_and_lines(run, team):
    held = set(json.loads((run / "test_split.json").read_text())["lines"])
    by_line = {c.line: c for c in read_file(team).conversations}
    mine = team_training(run)
    assert mine.file == "team.jsonl" and mine.conversations
    for conversation in mine.conversations:  # the very conversation of that line of the team's file
        assert conversation.line not in held and conversation.messages == by_line[conversation.line].messages
    assert not any(BASE_ANSWER in m.content for c in mine.conversations for m in c.messages)
    replies = [m.content for c in mine.conversations for m in c.messages if m.role == "assistant" and m.content]
    assert team_replies(run) == replies  # the team's voice reads the same rows


def test_the_recitation_check_never_counts_the_bases_replay_answers_and_names_the_teams_line(run, team):
    replies, name = training_replies_of(run)
    assert name == "team.jsonl"
    assert replies.recited(BASE_ANSWER, []) is None  # the base's own answer is not a training reply of the team's
    conversation = team_training(run).conversations[-1]
    reply = conversation.messages[-1].content
    assert replies.recited(reply, []) == conversation.line  # a line of the team's file, not of a copy
