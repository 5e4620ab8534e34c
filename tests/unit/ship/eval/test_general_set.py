"""The general set of `finetune eval RUN --retention`: reproducible, shipped, never the team's data, checked robustly."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from finetune.ship.eval.general_set import GENERAL_DIR, GeneralPrompt, load_general_set, numbers_in, passed

REPO = Path(__file__).resolve().parents[4]
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("generate_retention", EXAMPLES / "generate_retention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_set_is_what_the_generator_writes(generator, tmp_path):
    for written in generator.main(tmp_path):
        assert written.read_bytes() == (GENERAL_DIR / written.name).read_bytes(), f"rerun {generator.__file__}"


def test_the_set_ships_inside_the_package():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "finetune.ship.eval"
    ]
    shipped = {p.name for pattern in data for p in (REPO / "finetune" / "ship" / "eval").glob(pattern)}
    assert {"prompts.jsonl", "choices.jsonl"} <= shipped


def test_a_few_hundred_prompts_of_every_kind_and_some_multiple_choice():
    prompts, choices = load_general_set()
    kinds = Counter(p.kind for p in prompts)
    assert 200 <= len(prompts) <= 400 and set(kinds) == {"arithmetic", "conversion", "fact", "rule"}
    assert min(kinds.values()) >= 30
    assert len({p.rule for p in prompts if p.kind == "rule"}) >= 10
    assert 40 <= len(choices) <= 60
    assert all(len(c.options) == 4 and len(set(c.options)) == 4 and 0 <= c.answer < 4 for c in choices)
    assert max(Counter(c.answer for c in choices).values()) <= len(choices) // 4 + 1  # no favourite position
    ids = [p.id for p in prompts] + [c.id for c in choices]
    assert len(ids) == len(set(ids))


def _team_messages() -> list[str]:
    texts = []
    for name in ("train.jsonl", "test.jsonl", "prefs.jsonl"):
        for line in (EXAMPLES / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            messages = row.get("messages") or row["input"]["messages"] + row.get("preferred_output", [])
            texts += [" ".join(m["content"].lower().split()) for m in messages]
    return texts


def test_no_prompt_is_in_the_teams_data():
    prompts, choices = load_general_set()
    team = _team_messages()
    exact = set(team)
    assert len(team) > 800  # the three files were read
    for text in [p.prompt for p in prompts] + [c.question for c in choices]:
        norm = " ".join(text.lower().split())
        assert norm not in exact, text
        assert not any(norm in message for message in team), text


def test_numbers_are_read_from_digits_and_words():
    assert numbers_in("It ended in 1,945. Or 1945.0, or twenty-four, or twenty four and eight.") == [
        1945,
        1945,
        24,
        24,
        8,
    ]
    assert numbers_in("Water is H2O and CO2 is a gas") == []
    assert numbers_in("3, 4, 5") == [3, 4, 5]


def _item(check: dict, prompt: str = "What is 23 plus 12?") -> GeneralPrompt:
    return GeneralPrompt("x", "fact", prompt, check)


def test_a_number_check_ignores_the_numbers_of_the_prompt():
    item = _item({"number": [35]})
    assert passed(item, "23 plus 12 is 35.")
    assert passed(item, "The answer is thirty-five")
    assert not passed(item, "23 plus 12 is 36.")
    assert not passed(item, "")
    assert not passed(_item({"number": [12]}, "What is 7 plus 12?"), "7 plus 12 is 19")  # 12 is the prompt's


def test_a_term_check_matches_whole_words_in_any_case():
    item = _item({"any_of": ["Au"]}, "What is the chemical symbol for gold?")
    assert passed(item, "The symbol for gold is Au.") and passed(item, "au")
    assert not passed(item, "It is hard to say because of the August rain.")
    assert passed(_item({"any_of": ["Leonardo", "da Vinci"]}), "It was painted by Da Vinci.")


# one answer that keeps each rule of the set and one that breaks it
RULE_EXAMPLES = {
    "three_words": ("Warm and sunny.", "It is warm and sunny."),
    "one_word": ("Apple", "An apple"),
    "at_most_five_words": ("Cats are soft and playful.", "Cats are soft, small and very playful."),
    "lowercase": ("it is usually warm.", "It is usually warm."),
    "uppercase": ("IT IS WARM!", "IT IS Warm"),
    "ends_with_question": ("It is warm. Do you like summer?", "Do you like summer? It is warm."),
    "starts_with_sure": ("Sure, it is warm.", "It is warm, sure."),
    "no_commas": ("It is warm and sunny.", "It is warm, and sunny."),
    "in_quotes": ('"It is warm."', 'It is "warm".'),
    "numbered_three": ("1. Apples\n2. Pears\n3. Plums", "1. Apples\n2. Pears\n3. Plums\n4. Figs"),
    "starts_yes_no": ("Yes, it is.", "It is, yes."),
    "uses_word": (None, "No such word here."),
}


def test_every_rule_keeps_and_breaks_as_written():
    prompts, _ = load_general_set()
    rules = {p.rule: p for p in prompts if p.kind == "rule"}
    assert set(rules) == set(RULE_EXAMPLES)
    for rule, (good, bad) in RULE_EXAMPLES.items():
        item = rules[rule]
        if good is not None:
            assert passed(item, good), (rule, good)
        assert not passed(item, bad), (rule, bad)
    assert not passed(rules["one_word"], "------") and not passed(rules["three_words"], "- - -")  # no words
    for item in (p for p in prompts if p.rule == "uses_word"):
        word = item.prompt.split('"')[1]
        assert passed(item, f"A {word.upper()} thing.") and not passed(item, "Nothing.")


def test_every_prompt_passes_its_own_answer_and_fails_a_wrong_one():
    prompts, _ = load_general_set()
    for item in prompts:
        check = item.check
        if "number" in check:
            assert passed(item, f"The answer is {check['number'][0]}."), item
            assert not passed(item, f"The answer is {check['number'][0] + 1000}."), item
        elif "any_of" in check:
            assert passed(item, f"It is {check['any_of'][0]}."), item
            assert not passed(item, "I am not sure."), item
