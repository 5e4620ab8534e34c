"""bench/gpu_demo.sh's check, without a GPU: a run whose stages all sat on the GPU passes; one stage on the CPU (or
no stage at all) fails it. The script must at least parse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from bench.gpu_stages import main  # noqa: E402


def _stage(name: str, device: str) -> str:
    return json.dumps({"stage": name, "devices": [device], "dtypes": {"bfloat16": 10}, "seconds": 1.5,
                       "peak_gpu_bytes": 2**30 if device.startswith("cuda") else None})  # fmt: skip


def _demo(folder: Path, run_device: str) -> Path:
    (folder / "run").mkdir(parents=True)
    (folder / "stages.jsonl").write_text(_stage("demo: base answers", "cuda:0") + "\n")
    (folder / "run" / "stages.jsonl").write_text(
        _stage("training", "cuda:0") + "\n" + _stage("retention: base", run_device) + "\n"
    )
    (folder / "run" / "plan.json").write_text(
        json.dumps({"device": "cuda", "dtype": "bf16", "auto": {"dtype": "a GPU"}})
    )
    return folder


def test_every_stage_on_the_gpu_passes_and_one_on_the_cpu_fails(tmp_path, capsys):
    assert main([str(_demo(tmp_path / "ok", "cuda:0")), "--json", str(tmp_path / "ok.json")]) == 0
    printed = capsys.readouterr().out
    assert "retention: base" in printed and "1,024" in printed and "every model of the run on the GPU" in printed
    assert json.loads((tmp_path / "ok.json").read_text())["all_on_gpu"] is True
    assert main([str(_demo(tmp_path / "bad", "cpu"))]) == 1
    assert "ON THE CPU" in capsys.readouterr().out
    assert main([str(tmp_path)]) == 1  # nothing recorded: not a GPU run either


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu_demo.sh")]).returncode == 0
