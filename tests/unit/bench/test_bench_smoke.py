"""The benchmark machinery keeps working: a tiny finetune run and a tiny bare-loop run, in-process, 2 steps each.

The real benchmark (bench/throughput.py, with TRL) takes minutes; its TRL side runs only in the slow test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.data import generate_conversations  # noqa: E402
from bench.throughput import (  # noqa: E402
    Result,
    Spec,
    StepRecorder,
    prepare_assets,
    render_table,
    run_bare,
    run_finetune,
    summarize,
)


def test_data_is_deterministic_and_varied():
    first, again = generate_conversations(60, seed=0), generate_conversations(60, seed=0)
    assert first == again
    assert first != generate_conversations(60, seed=1)
    turns = {sum(m["role"] == "assistant" for m in c["messages"]) for c in first}
    assert {1, 2} <= turns and max(turns) >= 3  # single- and multi-turn
    assert any(c["messages"][0]["role"] == "system" for c in first)
    assert all(c["messages"][-1]["role"] == "assistant" for c in first)
    replies = sorted(len(m["content"].split()) for c in first for m in c["messages"] if m["role"] == "assistant")
    assert replies[0] < 40 and replies[-1] > 150  # short and long replies


def test_finetune_and_bare_runs_are_measured(tmp_path):
    data, model = prepare_assets(tmp_path, conversations=16, hidden=64, layers=1, model_vocab=4096)
    results = {}
    runs = {
        "finetune": run_finetune,
        "bare": run_bare,
        "bare-fused": lambda spec, recorder: run_bare(spec, recorder, fused=True),
    }
    for system, run in runs.items():
        spec = Spec(system, "lora", str(model), str(data), str(tmp_path / system), warmup=1, timed=1, lora_r=4)
        result = Result(system, "lora")
        recorder = StepRecorder(spec, result)
        run(spec, recorder)
        recorder.finish()
        assert len(result.step_end) == spec.total_steps == 2
        assert all(n > 0 for n in result.target_tokens + result.real_tokens)
        assert result.peak_rss_timed_mb > 0 and len(result.step_loss) == 2
        results[system] = summarize(system, [result.__dict__], warmup=1, timed=1)
    assert results["finetune"].records == 8  # batch 4 x accumulation 2
    assert results["finetune"].real <= results["finetune"].compute
    table = render_table(list(results.values()))
    assert all(f"| lora | {system} |" in table for system in runs)


@pytest.mark.slow
def test_whole_benchmark_with_trl(tmp_path):
    """One round of every system, one timed step each, on a tiny model (a minute or two on 2 CPU cores)."""
    out = tmp_path / "RESULTS.md"
    args = ["--rounds", "1", "--warmup", "1", "--timed", "1", "--hidden", "64", "--layers", "1", "--vocab", "4096"]
    args += ["--conversations", "40", "--work", str(tmp_path / "work"), "--results", str(out)]
    subprocess.run([sys.executable, str(REPO / "bench" / "throughput.py"), *args], check=True, cwd=REPO, timeout=1800)
    text = out.read_text()
    for name in ("finetune", "trl-padded", "trl-packed", "bare", "bare-fused"):
        assert f"| lora | {name} |" in text and f"| full | {name} |" in text
