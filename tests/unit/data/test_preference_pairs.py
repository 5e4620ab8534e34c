"""Preference files: both shapes read alike, each problem has its stable code, the split keeps a prompt whole."""

from __future__ import annotations

import json

import pytest

from finetune.cli import main
from finetune.config import RunConfig
from finetune.data.preference import is_preference_file, prepare_pairs, read_preferences, split_pairs
from finetune.data.tokenize import load_tokenizer

USER = {"role": "user", "content": "How do I reset my router?"}
GOOD = {"role": "assistant", "content": "Hold the reset button for ten seconds."}
BAD = {"role": "assistant", "content": "Please contact customer service."}


def _write(tmp_path, *lines) -> str:
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def openai(messages=(USER,), chosen=(GOOD,), rejected=(BAD,), **extra) -> dict:
    return {
        "input": {"messages": list(messages), **extra},
        "preferred_output": list(chosen),
        "non_preferred_output": list(rejected),
    }


def test_the_two_shapes_give_the_same_pair(tmp_path):
    a = read_preferences(_write(tmp_path, openai()))
    trl_text = {"prompt": USER["content"], "chosen": GOOD["content"], "rejected": BAD["content"]}
    b = read_preferences(_write(tmp_path, trl_text))
    c = read_preferences(_write(tmp_path, {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]}))
    assert a.ok and b.ok and c.ok
    assert a.format == "openai_preference" and b.format == c.format == "prompt_chosen_rejected"
    assert [(p.prompt, p.chosen, p.rejected) for p in a.pairs] == [(p.prompt, p.chosen, p.rejected) for p in b.pairs]
    assert a.pairs[0].prompt == c.pairs[0].prompt


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (openai(chosen=(GOOD,), rejected=(GOOD,)), "identical_chosen_and_rejected"),
        ({"prompt": "hi", "chosen": "same", "rejected": "same"}, "identical_chosen_and_rejected"),
        (openai(chosen=({"role": "assistant", "content": "  "},)), "empty_output"),
        (openai(rejected=()), "empty_output"),
        (openai(chosen=(GOOD, GOOD)), "more_than_one_output_message"),
        (openai(chosen=(USER,)), "output_not_assistant"),
        (openai(messages=(USER, GOOD)), "prompt_does_not_end_for_a_reply"),
        (openai(messages=()), "empty_prompt"),
        (openai(messages=({"role": "user"},)), "bad_message"),
        (openai(tools={"name": "x"}), "tools_not_list"),
        ({"input": {"messages": [USER]}, "preferred_output": [GOOD]}, "missing_key"),
        ({"prompt": "hi", "completion": "x", "chosen": "a"}, "missing_key"),
        ("{not json", "not_json"),
        ("[1, 2]", "not_object"),
    ],
)
def test_each_problem_has_its_code(tmp_path, line, code):
    trl = isinstance(line, dict) and "prompt" in line
    first = {"prompt": "q", "chosen": "a", "rejected": "b"} if trl else openai()  # one shape per file
    parsed = read_preferences(_write(tmp_path, first, line))
    assert not parsed.ok
    assert [(p.line, p.code) for p in parsed.errors] == [(2, code)]


def test_mixed_shapes_and_duplicates(tmp_path):
    parsed = read_preferences(_write(tmp_path, openai(), {"prompt": "a", "chosen": "b", "rejected": "c"}, openai()))
    assert [(p.line, p.code) for p in parsed.errors] == [(2, "mixed_formats")]
    assert [(p.line, p.code) for p in parsed.warnings] == [(3, "duplicate_pair")]


def test_validate_knows_a_preference_file(tmp_path, capsys):
    good = _write(tmp_path, openai(), openai(chosen=({"role": "assistant", "content": "Another good answer."},)))
    assert is_preference_file(good)
    assert main(["validate", good, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ok"] and document["stats"] == {"format": "openai_preference", "pairs": 2, "prompts": 1}
    bad = _write(tmp_path, openai(chosen=(GOOD,), rejected=(GOOD,)))
    assert main(["validate", bad]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:1 [identical_chosen_and_rejected]" in out and "NOT USABLE" in out


def test_the_split_keeps_every_pair_of_a_prompt_on_one_side(tmp_path):
    lines = []
    for prompt in range(30):
        for answer in range(3):
            user = {"role": "user", "content": f"question {prompt}"}
            lines.append(openai(messages=(user,), chosen=({"role": "assistant", "content": f"good {answer}"},)))
    pairs = read_preferences(_write(tmp_path, *lines)).pairs
    train, val = split_pairs(pairs, 0.2, seed=0)
    assert len(val) == 18 and len(train) == 72
    assert not {p.prompt for p in train} & {p.prompt for p in val}


def test_both_answers_are_tokenized_like_supervised_records(tmp_path, toy_model):
    lines = [openai(messages=({"role": "user", "content": f"question {i}"},)) for i in range(4)]
    config = RunConfig(data=_write(tmp_path, *lines), model=str(toy_model), method="dpo", val_fraction=0)
    tokenizer = load_tokenizer(str(toy_model))
    prepared = prepare_pairs(config, tokenizer)
    assert prepared.summary.examples == 4 and prepared.val == []
    pair = prepared.train[0]
    scored = lambda r: [t for t in r.labels if t != -100]  # noqa: E731
    assert tokenizer.decode(scored(pair.chosen)).startswith(GOOD["content"])
    assert tokenizer.decode(scored(pair.rejected)).startswith(BAD["content"])
    prompt_len = pair.chosen.labels.index(scored(pair.chosen)[0])
    assert pair.chosen.input_ids[:prompt_len] == pair.rejected.input_ids[:prompt_len]  # one prompt, two answers
    assert len(pair) == len(pair.chosen) + len(pair.rejected)


def test_input_tools_are_rendered_into_the_prompt_as_context(tmp_path, toy_model):
    tool = {
        "type": "function",
        "function": {"name": "check_outage", "parameters": {"type": "object", "properties": {}}},
    }
    config = RunConfig(data=_write(tmp_path, openai(tools=[tool])), model=str(toy_model), method="dpo", val_fraction=0)
    tokenizer = load_tokenizer(str(toy_model))
    pair = prepare_pairs(config, tokenizer).train[0]
    context = [t for t, label in zip(pair.chosen.input_ids, pair.chosen.labels, strict=True) if label == -100]
    assert "check_outage" in tokenizer.decode(context)
    assert "check_outage" not in tokenizer.decode([t for t in pair.chosen.labels if t != -100])
