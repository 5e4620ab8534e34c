"""docs/reliability.md's table of cases names every test in tests/reliability/, and only tests that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parents[1] / "docs" / "reliability.md"


def _tests_here() -> set[str]:
    found = set()
    for path in sorted(HERE.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found |= {
            f"{path.name}::{node.name}"
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
        }
    return found


def _tests_in_the_table() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("## The cases") : text.index("## Not covered")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| case ")]
    assert rows, "no table under '## The cases'"
    named = []
    for row in rows:
        last = row.rstrip(" |").rsplit(" | ", 1)[-1]
        refs = re.findall(r"`([\w.]+::\w+)`", last)
        assert refs, f"a row without a test: {row}"
        named += refs
    return named


def test_the_table_names_every_reliability_test_and_only_those():
    named = _tests_in_the_table()
    here = _tests_here()
    assert sorted(set(named) - here) == [], "the table names tests that do not exist"
    assert sorted(here - set(named)) == [], "tests missing from the table in docs/reliability.md"
