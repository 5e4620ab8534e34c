"""`finetune demo` runs end to end and the tuned model carries the house style more than the base."""

from __future__ import annotations

import json

from finetune.cli import main


def test_demo_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "demo.json").read_text())
    assert result["held_out_prompts"] >= 40 and len(result["examples"]) == 3
    assert result["house_style_rate_base"] == 0.0
    assert result["house_style_rate_tuned"] >= 0.5
    assert (out / "run" / "loss_curve.png").exists() and (out / "run" / "report.json").exists()
    assert "house style" in printed and "before" in printed and "after" in printed
    # a second demo replaces its own folder, but never a folder it did not make
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("user data")
    assert main(["demo", "--out", str(tmp_path / "mine")]) == 1
    assert (tmp_path / "mine" / "keep.txt").read_text() == "user data"
