"""Per instruction kind, the change of the share kept comes with its paired interval (the issue's per-kind target)."""

from __future__ import annotations

from types import SimpleNamespace

from finetune.ship.eval.intervals import paired_difference
from finetune.ship.eval.retention import _by_instruction


def test_each_kind_gets_the_paired_interval_of_its_own_outcomes():
    kinds = [("title",), ("title", "no_commas"), ("no_commas",), ("title",)]
    requests = [SimpleNamespace(instructions=[SimpleNamespace(kind=k) for k in row]) for row in kinds]
    kept = {"base": [[True], [True, True], [False], [True]], "tuned": [[False], [True, False], [False], [False]]}
    found = _by_instruction(requests, kept)
    assert found["title"]["n"] == 3 and found["title"]["base"] == 1.0 and found["title"]["tuned"] == 1 / 3
    assert found["title"]["change"] == paired_difference([True, True, True], [False, True, False])
    assert found["no_commas"]["change"] == paired_difference([True, False], [False, False])
    assert found["title"]["change"]["lost"] == 2 and found["title"]["change"]["high"] < 0.5
