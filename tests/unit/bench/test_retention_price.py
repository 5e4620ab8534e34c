"""bench/retention_price.py's points are settings the product takes, and its table prints what the JSON holds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import retention_price  # noqa: E402
from retention_table import retention_table  # noqa: E402

from finetune.settings.config import RunConfig  # noqa: E402


def test_every_point_is_a_valid_run_and_the_bound_ones_use_the_teams_own_message():
    for name in retention_price.POINTS:
        RunConfig(data="x.jsonl", model="m", out="o", **retention_price.values(name))
    rows = [json.loads(line) for line in (REPO / "examples" / "train.jsonl").read_text().splitlines()]
    systems = [r["messages"][0]["content"] for r in rows if r["messages"][0]["role"] == "system"]
    chosen = retention_price.values("replay-0.25-team-system")["team_system"]
    assert systems.count(chosen) == max(systems.count(s) for s in systems)


def test_the_table_prints_each_measure_with_its_interval():
    results = json.loads((REPO / "bench" / "retention_price_smollm2.json").read_text())
    table = retention_table(results)
    assert "| replay-0.25 | 156 | 140,412 | 100% | 0.021 / 0.037 (0.75) | — | 34% → 36% (+2, −3 to +8) |" in table
    assert "**17.0% → 13.0% (−4.0, −8.0 to −0.1)**" in table  # the dropped measure in bold
    assert "| sections (21) | 48% → 0% | 48% → 0% |" in table
