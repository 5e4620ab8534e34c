"""What the self-replay and forgetting-curve tests share: a team's file (their base: tests/replay_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"


@pytest.fixture
def team(tmp_path) -> str:
    lines = (EXAMPLES / "train.jsonl").read_text(encoding="utf-8").splitlines()[:48]
    path = tmp_path / "team.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)
