"""Planning loads no model (issue 49): a plan without an output folder counts self-replay's rows and the forgetting
curve's set instead of generating them, writes nothing (no /tmp/finetune-replay-*), and counts the steps the run takes;
the base answers when training starts, and `train --plan` of such a plan completes it. The replay cache keeps every
batch as it arrives: a run killed during generation loses nothing, and the next one answers only the rest."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from replay_fixtures import counting_base
from rich.console import Console

from finetune.commands.plan import make_plan
from finetune.data import replay_mix
from finetune.data.tokenize import load_tokenizer
from finetune.plan.plan import Plan
from finetune.plan.render import render_plan
from finetune.run import train
from finetune.settings.config import RunConfig
from finetune.ship.eval import replay

TESTS = Path(__file__).resolve().parents[3]
SETTINGS = {"replay": 0.25, "general_val": True, "epochs": 1, "batch_size": 4, "eval_every": 4, "gpu": "cpu"}
ANSWER = "A plain general answer."


@pytest.fixture
def no_model(monkeypatch, tmp_path):
    """The base answers with a fixed sentence when a run asks (counted); loading weights while planning fails."""
    monkeypatch.setattr(replay_mix, "training_prompts", lambda: replay_mix.replay_prompts()[:40])
    calls = counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: ANSWER, every_load=True)
    import transformers

    def refuse(*_args, **_kwargs):
        raise AssertionError("a model was loaded while planning")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    return calls


def test_a_plan_loads_no_model_generates_nothing_and_leaves_nothing_behind(team, toy_model, tmp_path, no_model,
                                                                          monkeypatch):  # fmt: skip
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    plan = make_plan(RunConfig(data=team, model=str(toy_model), **SETTINGS))
    assert no_model["load"] == no_model["generate"] == 0 and not list(scratch.iterdir())
    added, general = plan.replay_added, plan.general_val_set
    assert added["pending"]["prompts"] == 32 and added["pending"]["from_cache"] == 0  # a chunk: enough if all finish
    assert added["rows"] == round(0.25 * added["team_rows"]) and added["tokens"] > 0 and "generated" not in added
    assert plan.data.examples == added["team_rows"] + added["rows"] - 0  # the team's training records, then the rows
    assert general["pending"]["prompts"] == general["prompts"] == len(replay_mix.held_out_prompts())
    assert general["records"] == general["prompts"] and general["answers"] is None and general["cached"] is False
    assert plan.tokens_processed == plan.data.tokens_in_file * plan.epochs - added["tokens_processed"]
    console = Console(file=io.StringIO(), width=400)
    render_plan(plan, console)
    text = console.file.getvalue()
    assert "the base answers 32 prompts when training starts (" in text and "counted at the cap" in text
    assert f"the base's answers given to {general['prompts']} prompts when training starts (" in text


def test_the_run_takes_the_steps_the_plan_counted_and_its_answers_make_the_counts_exact(team, toy_model, tmp_path,
                                                                                       no_model, monkeypatch):  # fmt: skip
    preview = make_plan(RunConfig(data=team, model=str(toy_model), **SETTINGS))
    monkeypatch.undo()  # training loads the model; the base's answers stay the fixed sentence
    calls = counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: ANSWER)
    monkeypatch.setattr(replay_mix, "training_prompts", lambda: replay_mix.replay_prompts()[:40])
    run = train(RunConfig(data=team, model=str(toy_model), out=str(tmp_path / "run"), **SETTINGS))
    assert calls["generate"] > 0 and "pending" not in run.plan.replay_added
    assert run.plan.total_steps == preview.total_steps == run.loop.steps  # steps = plan.total_steps, counted before
    assert run.plan.data.examples == preview.data.examples
    assert run.plan.tokens_processed == preview.tokens_processed  # the bill: the team's tokens, exact in both
    assert run.plan.tokens_trained <= preview.tokens_trained  # answers counted at the cap: the most they can be
    again = make_plan(RunConfig(data=team, model=str(toy_model), **SETTINGS))  # every answer cached now: exact
    assert again.replay_added["pending"]["prompts"] == 0 and again.general_val_set["cached"] is True
    same = ("prompts", "answers", "records", "tokens", "target_tokens", "evaluations")  # not the time: a speed is known
    assert {k: again.general_val_set[k] for k in same} == {k: run.plan.general_val_set[k] for k in same}
    assert again.replay_added["tokens"] == run.plan.replay_added["tokens"]


def test_train_with_a_pending_plan_completes_it(team, toy_model, tmp_path, monkeypatch):
    monkeypatch.setattr(replay_mix, "training_prompts", lambda: replay_mix.replay_prompts()[:40])
    calls = counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: ANSWER)
    preview = make_plan(RunConfig(data=team, model=str(toy_model), **SETTINGS))
    document = json.loads(json.dumps(preview.to_dict()))  # as `finetune plan --json` writes it
    out = tmp_path / "run"
    run = train(RunConfig(data=team, model=str(toy_model), out=str(out)), plan=Plan.from_dict(document, out=str(out)))
    assert calls["generate"] > 0 and run.plan.replay_added["generated"]["answered_now"] > 0
    assert run.plan.total_steps == preview.total_steps == run.loop.steps
    written = json.loads((out / "plan.json").read_text())
    assert "pending" not in written["replay_added"] and written["settings"]["data"] == str(
        out / "replay" / "train.jsonl"
    )


# ----------------------------------------------------------------------------- the cache, batch by batch

KILLED_CHILD = """
import os, signal, sys
import pytest
sys.path.insert(0, {tests!r})
from replay_fixtures import counting_base
from rich.console import Console
from finetune.data.tokenize import load_tokenizer
from finetune.settings.config import RunConfig
from finetune.ship.eval import replay

prompts = {prompts!r}
asked = []

def answer(prompt):
    asked.append(prompt)
    if len(asked) > replay.CHUNK:  # the second batch: killed while the base answers it
        os.kill(os.getpid(), signal.SIGKILL)
    return "A plain general answer."

counting_base(pytest.MonkeyPatch(), {cache!r}, answer)
config = RunConfig(model={model!r})
replay.answer_prompts(config, load_tokenizer({model!r}), prompts, None)
"""


def test_a_replay_run_killed_midway_keeps_its_answers_and_the_next_answers_only_the_rest(toy_model, tmp_path,
                                                                                        monkeypatch):  # fmt: skip
    prompts = [p.text for p in replay_mix.replay_prompts()[:70]]
    cache = tmp_path / "cache"
    child = KILLED_CHILD.format(tests=str(TESTS), prompts=prompts, cache=str(cache), model=str(toy_model))
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    calls = counting_base(monkeypatch, cache, lambda _prompt: ANSWER)
    config = RunConfig(model=str(toy_model))
    tokenizer = load_tokenizer(str(toy_model))
    assert len(replay.cached_answers(config, tokenizer)) == replay.CHUNK  # the first batch, written when it came
    answered = replay.answer_prompts(config, tokenizer, prompts, None)
    assert calls["asked"] == prompts[replay.CHUNK :]  # only what the killed run had not answered
    assert answered.answered == len(prompts) - replay.CHUNK and len(answered.rows) == len(prompts)


def test_a_line_a_killed_run_left_cut_is_closed_before_the_next_batch(toy_model, tmp_path, monkeypatch):
    calls = counting_base(monkeypatch, tmp_path / "cache", lambda _prompt: ANSWER)
    config, tokenizer = RunConfig(model=str(toy_model)), load_tokenizer(str(toy_model))
    prompts = [p.text for p in replay_mix.replay_prompts()[:3]]
    replay.answer_prompts(config, tokenizer, prompts[:1], None)
    path = replay.cache_path(config, tokenizer)
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"prompt": "cut off mid-wri')  # what a kill during the write leaves
    replay.answer_prompts(config, tokenizer, prompts, None)
    assert calls["asked"] == [prompts[0], *prompts[1:]]
    assert set(replay.cached_answers(config, tokenizer)) == set(prompts)
    assert len(path.read_text(encoding="utf-8").splitlines()) == 4  # the cut line stands alone, read as damaged
