"""bench/call_path.py --by-module: where the calls from `finetune train` to the first step go, per module and function
(the whole count runs a training and is not a unit test; the breakdown of a count is)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.call_path import breakdown, by_module  # noqa: E402

CALLS = Counter({"data/read.py:read_file": 3, "data/read.py:_decode_line": 90, "run.py:plan_run": 1, "run.py:train": 1})


def test_calls_add_up_by_module_busiest_first():
    assert by_module(CALLS).most_common() == [("data/read.py", 93), ("run.py", 2)]


def test_the_breakdown_names_each_module_and_its_busiest_functions():
    lines = breakdown(CALLS, top=1).splitlines()
    assert lines[0].split() == ["93", "97.9%", "data/read.py"]
    assert lines[1].split() == ["90", "_decode_line"]  # one function per module with top=1
    assert lines[2].split()[-1] == "run.py" and len(lines) == 4
