"""A run trained with the team's system message (`team_system`) gets it where the team's context is meant: its test set
in `finetune eval RUN`, `finetune chat RUN` unless --system is given, and the serving of the run's model."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.commands.eval import EvalRequest, evaluate
from finetune.data.prompting import prompt_ids
from finetune.data.read import read_file
from finetune.data.tokenize import load_tokenizer
from finetune.ship.eval.generate import prompt_messages
from finetune.ship.run_folder import locate_weights, team_system_of
from finetune.ship.serving import Engine, ModelLocation, chat_completions_router

SYSTEM = "Reply in the voice of Brightside Support."


@pytest.fixture(scope="module")
def bound_run(lora_run, tmp_path_factory) -> Path:
    """The run as if trained with the team's system message (its plan.json says so; the weights are the run's)."""
    run = tmp_path_factory.mktemp("bound") / "run"
    shutil.copytree(lora_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    plan = json.loads((run / "plan.json").read_text())
    (run / "plan.json").write_text(json.dumps(plan | {"team_system": SYSTEM}))
    return run


def test_eval_answers_the_test_set_with_the_teams_system_message(bound_run, lora_run, monkeypatch):
    import finetune.commands.eval as eval_command

    asked: list[list[dict]] = []
    real = eval_command.generate_batches

    def answers(model, tokenizer, prompts, *args, **kwargs):
        asked.extend(prompts)
        return real(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(eval_command, "generate_batches", answers)
    tests = read_file(str(bound_run / "test.jsonl")).conversations[:3]
    assert any(c.messages[0].role != "system" for c in tests)  # some have no system message of their own
    evaluate(EvalRequest(data=str(bound_run), max_new_tokens=2, limit=3))
    bound = [prompt_messages(c) if c.messages[0].role == "system" else
             [{"role": "system", "content": SYSTEM}, *prompt_messages(c)] for c in tests]  # fmt: skip
    assert asked == bound * 2  # the base and the tuned model: the team's prompts, in the team's context
    asked.clear()
    evaluate(EvalRequest(data=str(lora_run), max_new_tokens=2, limit=3))
    assert asked == [prompt_messages(c) for c in tests] * 2 and team_system_of(lora_run) is None


def test_chat_starts_with_the_teams_system_message_unless_told_otherwise(bound_run, monkeypatch, capsys):
    import finetune.commands.chat as chat_command

    asked: list[list[dict]] = []

    def reply(model, tokenizer, messages, *args, **kwargs):
        asked.append(list(messages))
        yield "ok"

    monkeypatch.setattr(chat_command, "stream_reply", reply)
    question = {"role": "user", "content": "Hi, my parcel is late."}
    for args, system in (([], SYSTEM), (["--system", "Be brief."], "Be brief.")):
        monkeypatch.setattr("sys.stdin", io.StringIO(question["content"] + "\n"))
        assert main(["chat", str(bound_run), "--max-new-tokens", "8", *args]) == 0
        assert asked.pop() == [{"role": "system", "content": system}, question]
        assert ("the team's, as trained" in capsys.readouterr().err) == (not args)


def test_serving_puts_the_runs_message_first_on_requests_without_one(bound_run):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    weights = locate_weights(bound_run)
    location = ModelLocation(weights.base, str(weights.adapter), team_system_of(bound_run))
    app = FastAPI()
    app.include_router(chat_completions_router(lambda name, caller: location, Engine(max_models=2)))
    client = TestClient(app)
    tokenizer = load_tokenizer(weights.tokenizer)
    question = {"role": "user", "content": "Can I get a refund?"}
    for messages, seen in (([question], [{"role": "system", "content": SYSTEM}, question]),
                           ([{"role": "system", "content": "Be brief."}, question], None)):  # fmt: skip
        body = {"model": "ft:run", "messages": messages, "max_tokens": 2, "temperature": 0}
        usage = client.post("/v1/chat/completions", json=body).json()["usage"]
        assert usage["prompt_tokens"] == len(prompt_ids(tokenizer, seen or messages))  # what the model was given
