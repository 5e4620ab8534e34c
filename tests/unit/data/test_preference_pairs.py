"""Preference files: both shapes read alike, each problem has its stable code, the split keeps a prompt whole."""

from __future__ import annotations

import json

import pytest

from finetune.commands.cli import main
from finetune.data.pairs import prepare_pairs, split_pairs
from finetune.data.preference import is_preference_file, read_preferences
from finetune.data.tokenize import load_tokenizer
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError

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


TOOL = {"type": "function", "function": {"name": "check_outage", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "check_outage", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (openai(messages=({"role": "system", "content": "Be brief."},)), "prompt_does_not_end_for_a_reply"),
        (openai(messages=(USER, {"role": "user", "content": "again"}, GOOD)), "prompt_does_not_end_for_a_reply"),
        (openai(messages=(USER, USER)), "bad_role_order"),
        (openai(chosen=({"role": "assistant", "content": "x", "weight": 0},)), "bad_message"),
        (openai(chosen=({"role": "assistant", "tool_calls": [CALL]},), tools=[TOOL]), None),
        (
            openai(
                chosen=({"role": "assistant", "tool_calls": [CALL]},),
                tools=[{"type": "function", "function": {"name": "other"}}],
            ),
            "unknown_function",
        ),
        (openai(tools=[{"name": "no type"}]), "tools_not_list"),
        (
            {"prompt": [{"role": "developer", "content": "d"}], "chosen": "a", "rejected": "b"},
            "prompt_does_not_end_for_a_reply",
        ),
    ],
)
def test_prompts_and_answers_are_judged_as_conversations(tmp_path, line, code):
    parsed = read_preferences(_write(tmp_path, line))
    assert [p.code for p in parsed.errors] == ([code] if code else [])


def test_a_prompt_with_tool_calls_and_results_reads_and_renders(tmp_path, toy_model):
    messages = (
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"outage": true}'},
    )
    lines = [
        openai(messages=messages, tools=[TOOL]),
        openai(chosen=({"role": "assistant", "tool_calls": [CALL]},), tools=[TOOL]),
    ]
    parsed = read_preferences(_write(tmp_path, *lines))
    assert parsed.ok, parsed.errors
    assert [m.role for m in parsed.pairs[0].prompt] == ["user", "assistant", "tool"]
    assert parsed.pairs[1].chosen.tool_calls[0].name == "check_outage"
    config = RunConfig(data=_write(tmp_path, *lines), model=str(toy_model), method="dpo", val_fraction=0)
    tokenizer = load_tokenizer(str(toy_model))
    first, second = prepare_pairs(config, tokenizer).train
    scored = lambda r: tokenizer.decode([t for t in r.labels if t != -100])  # noqa: E731
    context = tokenizer.decode(
        [t for t, label in zip(first.chosen.input_ids, first.chosen.labels, strict=True) if label == -100]
    )
    assert '{"outage": true}' in context and scored(first.chosen).startswith(GOOD["content"])
    assert "check_outage" in scored(second.chosen) and "check_outage" not in scored(second.rejected)


def test_skip_invalid_keeps_the_valid_pairs_and_lists_the_others(tmp_path):
    other = {"role": "assistant", "content": "Try turning it off and on."}
    path = _write(tmp_path, openai(), openai(chosen=(GOOD,), rejected=(GOOD,)), openai(rejected=(other,)), "{oops")
    config = RunConfig(data=path, method="dpo", val_fraction=0)
    with pytest.raises(UserError, match="--skip-invalid"):
        prepare_pairs(config)
    prepared = prepare_pairs(RunConfig(data=path, method="dpo", val_fraction=0, skip_invalid=True))
    assert prepared.summary.examples == 2 and prepared.summary.skipped_lines == 2
    assert [(s["line"], s["codes"]) for s in prepared.skipped] == [
        (2, ["identical_chosen_and_rejected"]),
        (4, ["not_json"]),
    ]
    assert prepared.skipped[1]["text"] == "{oops"


def test_a_conversation_file_given_to_dpo_is_named_as_such(tmp_path):
    path = _write(tmp_path, {"messages": [USER, GOOD]}, {"messages": [USER, BAD]})
    with pytest.raises(UserError, match="holds no preference pairs.*without --method dpo"):
        prepare_pairs(RunConfig(data=path, method="dpo"))


def test_validation_pairs_sharing_a_training_prompt_are_left_out(tmp_path):
    other = {"role": "user", "content": "Where is my invoice?"}
    train = _write(tmp_path, openai())
    val = tmp_path / "val.jsonl"
    val.write_text(
        json.dumps(openai(rejected=({"role": "assistant", "content": "No."},)))
        + "\n"
        + json.dumps(openai(messages=(other,)))
        + "\n"
    )
    prepared = prepare_pairs(RunConfig(data=train, val_file=str(val), method="dpo"))
    assert prepared.summary.validation_examples == 1 and prepared.summary.duplicates_removed == 1


def test_a_cut_pair_says_at_column_once(tmp_path) -> None:
    """Issue 35: the pairs reader printed "Unterminated string starting at at column 20"."""
    from finetune.data.preference import read_preferences

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"input": {"messages": [{"role": "user", "content": "cut\n')
    problems = [p.message for p in read_preferences(path).errors]
    assert "not valid JSON (Unterminated string starting at column 53)" in problems, problems
