"""The replay prompts must not overlap the retention check's general set, whole or in part, nor come from its
generator: the check must stay an independent measure of what a run kept (docs/retention.md)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from finetune.data.replay_mix import PROMPTS_FILE, held_out_prompts, replay_prompts, training_prompts

ROOT = Path(__file__).resolve().parents[3]
GENERAL = ROOT / "finetune" / "ship" / "eval" / "general"
GENERATORS = (
    ROOT / "examples" / "generate_retention.py",
    ROOT / "examples" / "generate_general.py",
    ROOT / "examples" / "generate_instructions.py",
)
LONG = 8  # words: a shared run this long is overlap
TEMPLATE = 6  # words: a run this long of a generator's own text is borrowing


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9']+", " ", text.lower()).split()


def _normal(text: str) -> str:
    return " ".join(_words(text))


def _grams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _retention_texts() -> list[str]:
    texts = []
    for line in (GENERAL / "prompts.jsonl").read_text(encoding="utf-8").splitlines():
        texts.append(json.loads(line)["prompt"])
    for line in (GENERAL / "choices.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        texts += [row["question"], row["lead"]]
    for line in (GENERAL / "instructions.jsonl").read_text(encoding="utf-8").splitlines():
        texts.append(json.loads(line)["prompt"])
    return texts


def _generator_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_the_package_ships_a_few_hundred_diverse_prompts():
    rows = replay_prompts()
    assert len(rows) >= 250
    assert len({row.text for row in rows}) == len(rows)
    assert len({row.kind for row in rows}) >= 8
    assert PROMPTS_FILE.is_file()


def test_a_slice_is_held_out_and_never_trained_on():
    held, trained = held_out_prompts(), training_prompts()
    assert 0.05 * len(replay_prompts()) <= len(held) <= 0.25 * len(replay_prompts())
    assert not {p.text for p in held} & {p.text for p in trained}
    assert len(held) + len(trained) == len(replay_prompts())


def test_no_replay_prompt_overlaps_the_retention_set():
    retention = _retention_texts()
    assert len(retention) > 300
    retention_normal = [_normal(text) for text in retention]
    retention_grams = set().union(*(_grams(text, LONG) for text in retention))
    for row in replay_prompts():
        mine = _normal(row.text)
        for theirs in retention_normal:
            assert mine != theirs and theirs not in mine and mine not in theirs, (row.id, theirs)
        shared = _grams(row.text, LONG) & retention_grams
        assert not shared, (row.id, shared)


def test_no_replay_prompt_borrows_the_retention_generators_text():
    borrowed = set()
    for path in GENERATORS:
        for literal in _generator_literals(path):
            borrowed |= _grams(literal, TEMPLATE)
    assert borrowed  # the generators have text long enough to compare
    for row in replay_prompts():
        shared = _grams(row.text, TEMPLATE) & borrowed
        assert not shared, (row.id, shared)


def test_the_check_itself_catches_overlap():
    """The rule above would catch a copy: a retention prompt inside a longer request shares its n-grams."""
    theirs = next(text for text in _retention_texts() if len(_words(text)) >= LONG)
    copy = f"Please, {theirs.upper()}  and explain"
    assert _normal(theirs) in _normal(copy)
    assert _grams(copy, LONG) & _grams(theirs, LONG)


def test_the_generator_reproduces_the_committed_file():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_replay_prompts", ROOT / "examples" / "make_replay_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in module.prompts())
    assert written == PROMPTS_FILE.read_text(encoding="utf-8")
