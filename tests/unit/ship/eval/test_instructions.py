"""The instruction checks of the retention check's longer answers, the set that asks them, and the team's voice."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from finetune.ship.eval import retention
from finetune.ship.eval.general_set import GENERAL_DIR, INSTRUCTIONS_FILE, load_instructions
from finetune.ship.eval.instructions import CHECKS, Instruction, follows
from finetune.ship.eval.team_voice import signature_lines, speaks_as_team

ROOT = Path(__file__).resolve().parents[4]

KEPT_AND_BROKEN = [  # (kind, args, an answer that keeps it, one that does not)
    ("title", {}, "<<Bees on Roofs>>\nCity bees thrive.", "Bees on Roofs\nCity bees thrive."),
    ("postscript", {"marker": "P.S."}, "Dear Ann,\nSee you.\n\nP.S. Bring a hat.", "Dear Ann,\nSee you. Warm regards"),
    ("postscript", {"marker": "P.P.S."}, "Text.\n**P.P.S.** One more thing.", "Text.\nP.S. One more thing."),
    ("placeholders", {"at_least": 2}, "Meet at [place] on [date].", "Meet at [place] on Friday."),
    ("bullets", {"exactly": 3}, "Tips:\n* one\n* two\n- three", "Tips:\n* one\n* two"),
    ("json", {}, '```json\n{"title": "Bees"}\n```', 'Here it is: {"title": "Bees"}'),
    ("forbidden_words", {"words": ["honey", "hive"]}, "Bees make a sweet syrup.", "Bees make Honey."),
    ("keywords", {"words": ["rooftop", "pollen"]}, "Pollen on the rooftop.", "Pollen on the roof."),
    ("letter_frequency", {"letter": "k", "at_least": 3}, "Kites kick knots.", "Kites fly."),
    ("word_count", {"at_least": 5}, "one two three four five", "one two three four"),
    ("word_count", {"less_than": 4}, "one two three", "one two three four"),
    ("lowercase", {}, "all quiet here.", "All quiet here."),
    ("capitals", {}, "ALL QUIET HERE.", "ALL QUIET HERe."),
    ("no_commas", {}, "Bees fly and sing.", "Bees fly, and sing."),
    ("end_phrase", {"phrase": "Thank you for reading."}, "Bees.\nThank you for reading.", "Thank you for reading. Bye"),
    ("quoted", {}, '"Bees fly."', 'Bees "fly."'),
    ("paragraphs", {"exactly": 2}, "One.\n***\nTwo.", "One.\n\nTwo."),
    ("sections", {"word": "Part", "at_least": 2}, "Part 1\nBees.\n## Part 2\nHives.", "Part 1\nBees.\nHives."),
    ("highlights", {"at_least": 2}, "A *key* and **bold** part.", "A *key* part only."),
]


@pytest.mark.parametrize(("kind", "args", "kept", "broken"), KEPT_AND_BROKEN)
def test_each_check_tells_a_kept_instruction_from_a_broken_one(kind, args, kept, broken):
    assert follows(Instruction(kind, args), kept)
    assert not follows(Instruction(kind, args), broken)


def test_every_kind_is_checked_above():
    assert {kind for kind, *_ in KEPT_AND_BROKEN} == set(CHECKS)


def test_the_set_asks_longer_answers_with_one_or_two_instructions_of_every_kind():
    requests = load_instructions()
    assert len(requests) >= 250  # an interval of a few points on the strict pass-rate
    assert {len(r.instructions) for r in requests} == {1, 2}
    assert {i.kind for r in requests for i in r.instructions} == set(CHECKS)
    assert len({r.prompt for r in requests}) == len(requests)
    assert all("words" in r.prompt for r in requests)  # a length is asked (or a word count is the instruction)


def test_the_generator_reproduces_the_committed_file(tmp_path):
    spec = importlib.util.spec_from_file_location("gen", ROOT / "examples" / "generate_instructions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.main(tmp_path)
    assert written.read_bytes() == (GENERAL_DIR / INSTRUCTIONS_FILE).read_bytes()
    for line in written.read_text().splitlines():
        row = json.loads(line)
        for instruction in row["instructions"]:
            follows(Instruction(instruction["kind"], instruction.get("args", {})), "any answer")  # known kinds


TEAM = [
    "Hi there, thanks for reaching out to Brightside Support!\n\nYour refund is on its way.\n\nWarm regards,\nSam from "
    "Brightside Support",
    "Hi there, thanks for reaching out to Brightside Support!\n\nThe outage is fixed.\n\nWarm regards,\nSam from "
    "Brightside Support",
    "Hi there, thanks for reaching out to Brightside Support!\n\nYour plan changes on Monday.\n\nBest,\nSam",
    "Your invoice is attached.",
]


def test_the_team_voice_is_its_recurring_lines_of_three_words_or_more():
    lines = signature_lines(TEAM)
    assert lines == ["hi there thanks for reaching out to brightside support", "sam from brightside support"]
    assert "warm regards" not in lines  # two words: anyone's letter may say it


def test_a_general_answer_carrying_a_team_line_speaks_as_the_team():
    lines = signature_lines(TEAM)
    assert speaks_as_team("Hi there, thanks for reaching out to Brightside Support! Here is your poem.", lines)
    assert speaks_as_team("A poem.\n\nWarm regards,\nSAM FROM BRIGHTSIDE SUPPORT", lines)
    assert not speaks_as_team("Hi there! Here is a poem about the sea.\n\nWarm regards", lines)
    assert not speaks_as_team("anything", signature_lines([]))


def test_the_retention_check_keeps_how_many_team_lines_there_are_never_their_text():
    """Issue 47: a sign-off is where a phone number or an address lives; retention.json (and eval.json, demo.json and
    the service's results, which copy its summary) kept the lines, lowercased. Now a count."""
    team = [
        f"Your refund is on its way ({i}).\n\nCall us on 415 555 2671 any time.\nSam from Brightside" for i in range(5)
    ]
    texts = {
        "base": {"prompts": ["A poem about the sea."] * 4, "requests": []},
        "tuned": {"prompts": ["A poem.\nCall us on 415 555 2671 any time."] * 4, "requests": []},
    }
    voice = retention._team_voice(texts, team)
    assert voice["lines"] == 2 and voice["tuned"]["correct"] == 4
    assert "2671" not in json.dumps(voice) and "brightside" not in json.dumps(voice)
    assert "requests" not in retention.summary({"requests": [{"tuned": "Call us on 415 555 2671"}], "flag": False})
