"""Fixtures for the data tests: the shared toy model folder and a JSONL writer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def toy_model_dir(toy_model: Path) -> str:
    """The session's toy model (tests/conftest.py) as a string: ChatML tokenizer, end-of-turn `<|im_end|>`."""
    return str(toy_model)


@pytest.fixture
def write_file(tmp_path) -> Callable[..., str]:
    """write_file(content) -> path. `content` is bytes (written as is), a str, or a list of lines (objects become JSON)."""
    counter = iter(range(10**6))

    def write(content: bytes | str | list, name: str | None = None) -> str:
        path = Path(tmp_path) / (name or f"data-{next(counter)}.jsonl")
        if isinstance(content, list):
            content = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in content)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return str(path)

    return write


@pytest.fixture
def chat() -> Callable[..., dict]:
    return make_chat


def make_chat(*turns: tuple, system: str | None = None) -> dict:
    """chat(("user", "hi"), ("assistant", "hello", 0.5)) -> {"messages": [...]}; a third item is the weight."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    for turn in turns:
        message = {"role": turn[0], "content": turn[1]}
        if len(turn) > 2:
            message["weight"] = turn[2]
        messages.append(message)
    return {"messages": messages}
