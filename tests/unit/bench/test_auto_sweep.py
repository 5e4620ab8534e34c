"""bench/auto_sweep.py keeps working: Auto and a two-point sweep on a small set, scored and summarised.

The real sweep (three sizes, 12 points, the peers' defaults) takes many minutes; its results are in bench/AUTO.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.auto_sweep import PEER_DEFAULTS, main, markdown, sweep_grid  # noqa: E402


def test_the_full_grid_has_twelve_points_lora_and_full():
    grid = sweep_grid("full")
    assert len(grid) >= 12 and {p.values.get("method", "lora") for p in grid} == {"lora", "full"}
    assert len({p.values["lr"] for p in grid}) >= 3 and len({p.values["epochs"] for p in grid}) >= 2
    assert {p.name for p in PEER_DEFAULTS} == {"TRL defaults", "Unsloth defaults", "LLaMA-Factory defaults"}


def test_two_point_sweep_runs_and_scores_every_point(toy_model, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    args = [
        "--base",
        str(toy_model),
        "--sizes",
        "20",
        "--grid",
        "smoke",
        "--peers",
        "none",
        "--test-prompts",
        "3",
        "--val",
        "6",
    ]
    assert main([*args, "--json", str(out), "--markdown", str(tmp_path / "AUTO.md")]) == 0
    results = json.loads(out.read_text())
    rows = results["sizes"]["20"]["rows"]
    assert [r["kind"] for r in rows] == ["auto", "sweep", "sweep"]
    assert rows[0]["set"] == {} and rows[0]["method"] == "lora"  # Auto's point overrides nothing
    assert {r["method"] for r in rows[1:]} == {"lora", "full"}
    assert all(r["best_val_loss"] > 0 and 0 <= r["house_style"] <= 1 for r in rows)
    summary = results["sizes"]["20"]["summary"]
    best = min(r["best_val_loss"] for r in rows[1:])
    assert summary["ratio"] == rows[0]["best_val_loss"] / best
    printed = capsys.readouterr().out
    assert "Auto ÷ best" in printed and f"{summary['ratio']:.3f}" in printed
    assert markdown(results) == (tmp_path / "AUTO.md").read_text() and "| 20 |" in markdown(results)

    # --resume with --points: the points asked are kept (nothing trains again), every other row and size stays
    results["sizes"]["999"] = {"rows": [dict(rows[1], name="measured elsewhere")]}
    out.write_text(json.dumps(results))
    assert main([*args, "--points", "Auto", "--resume", str(out), "--json", str(out)]) == 0
    again = json.loads(out.read_text())
    assert sorted(r["name"] for r in again["sizes"]["20"]["rows"]) == sorted(r["name"] for r in rows)
    assert again["sizes"]["999"] == results["sizes"]["999"]
