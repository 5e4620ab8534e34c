"""The bundled example dataset (examples/): deterministic, big enough, held out, in the house style."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = ["train.jsonl", "test.jsonl", "house_style.json", "README.md"]


@pytest.fixture(scope="module")
def generate():
    spec = importlib.util.spec_from_file_location("examples_generate", EXAMPLES / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(name: str) -> list[dict]:
    lines = (EXAMPLES / name).read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "", f"{name} must end with a newline"
    assert all(line.strip() for line in lines[:-1]), f"{name} has a blank line"
    return [json.loads(line) for line in lines[:-1]]


@pytest.fixture(scope="module")
def train() -> list[dict]:
    return _load("train.jsonl")


@pytest.fixture(scope="module")
def test_set() -> list[dict]:
    return _load("test.jsonl")


def _assistant_replies(conversations: list[dict]) -> list[str]:
    return [m["content"] for c in conversations for m in c["messages"] if m["role"] == "assistant"]


def _key(conversation: dict) -> str:
    return json.dumps(conversation, sort_keys=True, ensure_ascii=False)


def test_generator_reproduces_the_committed_files_byte_for_byte(generate, tmp_path):
    written = generate.main(tmp_path)
    assert sorted(written) == sorted(FILES)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (EXAMPLES / name).read_bytes(), f"{name} differs: rerun generate.py"
    again = tmp_path / "again"
    generate.main(again)
    for name in FILES:
        assert (again / name).read_bytes() == (tmp_path / name).read_bytes()


def test_files_are_utf8_without_bom():
    for name in FILES:
        data = (EXAMPLES / name).read_bytes()
        assert not data.startswith(b"\xef\xbb\xbf"), name
        data.decode("utf-8")
        assert b"\r" not in data, name


def test_house_style_json_matches_the_generator_constants(generate):
    style = json.loads((EXAMPLES / "house_style.json").read_text(encoding="utf-8"))
    assert style == {"greeting": generate.GREETING, "sign_off": generate.SIGN_OFF}
    assert style["greeting"] and style["sign_off"]


def test_chat_format(train, test_set):
    for conversation in train + test_set:
        assert set(conversation) == {"messages"}
        messages = conversation["messages"]
        roles = [m["role"] for m in messages]
        assert "system" not in roles[1:]
        turns = roles[1:] if roles[0] == "system" else roles
        assert turns == ["user", "assistant"] * (len(turns) // 2) and turns
        for message in messages:
            assert isinstance(message["content"], str) and message["content"].strip()
            allowed = {"role", "content", "weight"} if message["role"] == "assistant" else {"role", "content"}
            assert set(message) <= allowed


def test_train_counts(train):
    assert len(train) >= 300
    n = len(train)
    multi = sum(1 for c in train if sum(m["role"] == "user" for m in c["messages"]) > 1)
    system = sum(1 for c in train if c["messages"][0]["role"] == "system")
    weighted = [c for c in train if any("weight" in m for m in c["messages"])]
    assert 0.15 * n <= multi <= 0.35 * n
    assert 0.10 * n <= system <= 0.30 * n
    assert 1 <= len(weighted) <= 0.05 * n
    for conversation in weighted:
        assistants = [m for m in conversation["messages"] if m["role"] == "assistant"]
        assert assistants[-1].get("weight", 1) > 0, "the last reply stays a target"
        assert all(m.get("weight", 1) in (0, 1) for m in assistants)


def test_test_set_is_single_turn_unweighted_and_held_out(train, test_set):
    assert len(test_set) >= 40
    for conversation in test_set:
        assert [m["role"] for m in conversation["messages"] if m["role"] != "system"] == ["user", "assistant"]
        assert all("weight" not in m for m in conversation["messages"])
    train_keys = {_key(c) for c in train}
    assert not train_keys & {_key(c) for c in test_set}
    train_users = {m["content"] for c in train for m in c["messages"] if m["role"] == "user"}
    test_users = [m["content"] for c in test_set for m in c["messages"] if m["role"] == "user"]
    assert not set(test_users) & train_users


def test_no_duplicate_conversations_in_train(train):
    keys = [_key(c) for c in train]
    assert len(set(keys)) == len(keys)


def test_every_assistant_reply_is_in_the_house_style(generate, train, test_set):
    replies = _assistant_replies(train) + _assistant_replies(test_set)
    for reply in replies:
        assert reply.startswith(generate.GREETING) and reply.endswith(generate.SIGN_OFF), reply
        assert reply.count(generate.GREETING) == 1 and reply.count(generate.SIGN_OFF) == 1
        assert 25 <= len(reply.split()) <= 70, reply


def test_no_user_message_uses_the_house_style(generate, train, test_set):
    for conversation in train + test_set:
        for message in conversation["messages"]:
            if message["role"] != "assistant":
                assert generate.GREETING not in message["content"]
                assert generate.SIGN_OFF not in message["content"]


def test_the_preference_set_is_regenerated_byte_identical_from_train_only(tmp_path, train, test_set):
    spec = importlib.util.spec_from_file_location("examples_generate_prefs", EXAMPLES / "generate_prefs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([str(tmp_path / "prefs.jsonl")])
    assert (tmp_path / "prefs.jsonl").read_bytes() == (EXAMPLES / "prefs.jsonl").read_bytes()
    pairs = _load("prefs.jsonl")
    house = json.loads((EXAMPLES / "house_style.json").read_text())
    held_out = {m["content"] for c in test_set for m in c["messages"] if m["role"] == "user"}
    assert len(pairs) == len(train)
    for pair in pairs:
        assert pair["preferred_output"][0]["content"].startswith(house["greeting"])
        assert house["greeting"] not in pair["non_preferred_output"][0]["content"]
        assert not {m["content"] for m in pair["input"]["messages"]} & held_out
