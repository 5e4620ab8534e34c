"""Two processes on torch.distributed (gloo, CPU) learn what one process learns, and fail or stop as one.

Each 2-process run goes through the command line, `finetune train ... --devices 2`, which starts torchrun's
launcher; the 1-process references run in this process. Faults are injected by a `sitecustomize` module
put on the workers' PYTHONPATH (HOOKS below): the package itself holds no test hooks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from finetune.commands.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

DATA = str(EXAMPLES / "train.jsonl")
STEPS = 8
SHARED = ["--epochs", "1", "--max-steps", str(STEPS), "--lr", "1e-3", "--eval-every", "4", "--max-seq-len", "512"]
SHARED += ["--dtype", "fp32"]  # the equivalences hold to their tolerances in fp32, whatever Auto would choose
ADAPTER = "adapter/adapter_model.safetensors"
# fp32: both runs add the same per-record gradients, in another order (one all-reduce across processes vs
# accumulation, one thread per process vs two), and AdamW's division by sqrt(v) turns that rounding into
# weight differences of up to ~1e-6 (measured: ≤ 1.1e-6 after 8 steps at lr 1e-3); a real difference in what
# is learned (other records, another loss normalisation) moves weights by ~1e-4 and more.
WEIGHTS_ATOL = 1e-5

HOOKS = '''
"""Test-only faults for `finetune train --devices 2` workers (RANK is set by torchrun)."""
import os
import signal

rank = os.environ.get("RANK")
if rank is not None and os.environ.get("TEST_FAIL_ON_RANK") == rank:
    from finetune.train.objective import TokenNormalisedSFT

    def fail(*args, **kwargs):
        raise ValueError(f"injected failure on rank {rank}")

    TokenNormalisedSFT.batch = fail  # a fault while building a micro-batch (the loss is left alone)
if rank == "0" and os.environ.get("TEST_SIGTERM_LAUNCHER_AT_STEP"):
    import finetune.report.metrics as metrics

    append = metrics.MetricsLog.append

    def append_then_stop(self, row):
        append(self, row)
        if row["step"] == int(os.environ["TEST_SIGTERM_LAUNCHER_AT_STEP"]):
            os.kill(os.getppid(), signal.SIGTERM)  # to the launcher, which forwards it to every worker

    metrics.MetricsLog.append = append_then_stop
'''


def train_on_two(
    toy_model: Path, out: Path, *flags: str, data: str = DATA, hooks: Path | None = None, **env: str
) -> subprocess.CompletedProcess:
    """`finetune train --devices 2` as a user runs it; fails the test instead of hanging."""
    environ = {**os.environ, **env}
    if hooks:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "finetune", "train", data, "--model", str(toy_model), "--out", str(out)]
    return subprocess.run(
        [*command, *SHARED, "--devices", "2", *flags], capture_output=True, text=True, env=environ, timeout=240
    )


def train_on_one(toy_model: Path, out: Path, *flags: str, data: str = DATA) -> None:
    assert main(["train", data, "--model", str(toy_model), "--out", str(out), *SHARED, *flags]) == 0


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_same_weights(got: Path, expected: Path, atol: float) -> None:
    a, b = load_file(got), load_file(expected)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=atol), (name, float((a[name] - b[name]).abs().max()))


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hooks")
    (folder / "sitecustomize.py").write_text(HOOKS)
    return folder


@pytest.fixture(scope="module")
def one_process(toy_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    train_on_one(toy_model, out, "--batch-size", "4", "--grad-accum", "2")
    return out


@pytest.fixture(scope="module")
def two_processes(toy_model, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("two") / "run"
    result = train_on_two(toy_model, out, "--batch-size", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


# ----------------------------------------------------------------------------- DDP (LoRA)


def test_two_processes_learn_what_one_process_learns(one_process, two_processes):
    """2 processes × batch 4 == 1 process × batch 4 × accumulation 2: same records per step, same loss."""
    two, _ = two_processes
    assert_same_weights(two / ADAPTER, one_process / ADAPTER, WEIGHTS_ATOL)
    rows_one, rows_two = metrics(one_process), metrics(two)
    assert [r["target_tokens"] for r in rows_two] == [r["target_tokens"] for r in rows_one]
    for a, b in zip(rows_two, rows_one, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert ("val_loss" in a) == ("val_loss" in b)
        if "val_loss" in a:  # sharded across the ranks, reduced token-weighted: the 1-process value
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    plan = json.loads((two / "plan.json").read_text())
    assert plan["devices"] == 2 and plan["effective_batch"] == 8


def test_only_rank_0_writes_outputs(two_processes):
    out, result = two_processes
    assert {p.name for p in out.iterdir()} == {
        "plan.json",
        "metrics.jsonl",
        "loss_curve.png",
        "report.json",
        "checkpoints",
        "adapter",
        "stages.jsonl",  # where each stage ran (placement/stages.py)
    }
    assert [row["step"] for row in metrics(out)] == list(range(1, STEPS + 1))  # one line per step, none twice
    report = json.loads((out / "report.json").read_text())
    assert report["steps_taken"] == STEPS
    assert result.stderr.count("Run summary") == 1 and result.stdout == ""  # one summary, from rank 0, on stderr
    assert not list(out.rglob("*.tmp"))


def test_resume_after_sigterm_to_the_launcher(two_processes, hooks, toy_model, tmp_path):
    """SIGTERM to `finetune train --devices 2`: every rank stops after the same step with a checkpoint; --resume
    on 2 processes ends with the uninterrupted run's weights, bit for bit, and on 1 process up to rounding."""
    reference, _ = two_processes
    out = tmp_path / "cut"
    stopped = train_on_two(toy_model, out, "--batch-size", "4", hooks=hooks, TEST_SIGTERM_LAUNCHER_AT_STEP="2")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "--resume" in stopped.stderr
    step = int(sorted((out / "checkpoints").iterdir())[-1].name.split("-")[1])
    assert 2 <= step < STEPS
    assert len(metrics(out)) == step
    shutil.copytree(out, tmp_path / "cut-on-one")

    resumed = train_on_two(toy_model, out, "--batch-size", "4", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(out / ADAPTER, reference / ADAPTER, atol=0.0)
    assert [row["step"] for row in metrics(out)] == list(range(1, STEPS + 1))

    # another device count: the steps keep their records, so only float rounding differs
    train_on_one(toy_model, tmp_path / "cut-on-one", "--batch-size", "4", "--grad-accum", "2", "--resume")
    assert_same_weights(tmp_path / "cut-on-one" / ADAPTER, reference / ADAPTER, WEIGHTS_ATOL)


def test_a_failing_rank_ends_the_run_with_its_message(hooks, toy_model, tmp_path):
    started = time.monotonic()
    result = train_on_two(toy_model, tmp_path / "run", "--batch-size", "4", hooks=hooks, TEST_FAIL_ON_RANK="1")
    assert result.returncode == 1
    assert time.monotonic() - started < 120  # the other rank did not wait for its collective timeout
    assert "error: rank 1 failed first: ValueError: injected failure on rank 1" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- FSDP (full fine-tuning)


def test_fsdp_two_processes_learn_what_one_process_learns(toy_model, tmp_path):
    """--method full --shard full: the model sharded across 2 processes, gradients reduce-scattered (summed).

    27 conversations: 22 training records, so each epoch's last step holds 6 records in 4 micro-batches of
    2 (rank 1 runs one real and one silent micro-batch), and 5 validation records split 3/2 across ranks:
    the ranks' FSDP collectives must still pair up.
    """
    data = tmp_path / "small.jsonl"
    data.write_text("".join(Path(DATA).read_text().splitlines(keepends=True)[:27]))
    full = ["--method", "full", "--epochs", "2", "--eval-every", "2", "--batch-size", "2"]
    two = train_on_two(toy_model, tmp_path / "two", *full, "--grad-accum", "2", "--shard", "full", data=str(data))
    assert two.returncode == 0, two.stderr[-3000:]
    train_on_one(toy_model, tmp_path / "one", *full, "--grad-accum", "4", data=str(data))
    plan = json.loads((tmp_path / "two" / "plan.json").read_text())
    assert plan["shard"] == "full" and plan["examples"] % plan["effective_batch"] != 0
    weights = "model/model.safetensors"
    assert_same_weights(tmp_path / "two" / weights, tmp_path / "one" / weights, WEIGHTS_ATOL)
    for a, b in zip(metrics(tmp_path / "two"), metrics(tmp_path / "one"), strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
        assert ("val_loss" in a) == ("val_loss" in b)
        assert a.get("val_loss", 0.0) == pytest.approx(b.get("val_loss", 0.0), rel=1e-5)


# ----------------------------------------------------------------------------- failure reporting (no processes)


def test_a_rank_failure_is_recorded_with_its_rank(tmp_path, monkeypatch):
    from finetune.settings.errors import UserError
    from finetune.train.distributed import DistContext, RankFailed, rank_failures

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    two = DistContext(rank=1, world_size=2)
    with pytest.raises(RankFailed, match=r"^rank 1: ValueError: boom$"), rank_failures(two):
        raise ValueError("boom")
    recorded = json.loads(error_file.read_text())
    assert recorded["finetune"]["rank"] == 1 and recorded["finetune"]["user_error"] is False
    assert "Traceback" in recorded["message"]["extraInfo"]["py_callstack"]  # what plain torchrun shows
    with pytest.raises(UserError, match=r"^rank 1: no such file$"), rank_failures(two):
        raise UserError("no such file")
    with pytest.raises(KeyError), rank_failures(two, passthrough=(KeyError,)):
        raise KeyError("a stop every rank raises alike")


def test_the_launcher_names_the_rank_that_failed_first(capsys):
    from types import SimpleNamespace

    from finetune.train.launch import _report_failure

    def failure(rank: int, at: float, message: str) -> SimpleNamespace:
        data = {"finetune": {"rank": rank, "time": at, "message": message, "user_error": False}}
        return SimpleNamespace(error_file_data=data, exitcode=1, error_file=f"/logs/{rank}/error.json")

    failures = {0: failure(0, 10.5, "lost contact with the other ranks"), 1: failure(1, 10.2, "ValueError: boom")}
    assert _report_failure(failures) == 1
    err = capsys.readouterr().err
    assert "error: rank 1 failed first: ValueError: boom" in err and "/logs/1/error.json" in err

    # a rank that lost contact is a consequence: the cause here is rank 1, killed without a word
    lost = failure(0, 10.5, "lost contact with the other ranks")
    lost.error_file_data["finetune"]["lost_contact"] = True
    killed = SimpleNamespace(error_file_data={}, exitcode=-9, timestamp=11, signal_name=lambda: "SIGKILL")
    assert _report_failure({0: lost, 1: killed}) == 1
    assert "error: rank 1 was killed by SIGKILL" in capsys.readouterr().err

    stopped = {r: SimpleNamespace(error_file_data={}, exitcode=143, timestamp=0) for r in (0, 1)}
    assert _report_failure(stopped) == 143  # every rank checkpointed and said so itself
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- preference tuning (DPO, LoRA)


def test_two_processes_learn_what_one_process_learns_dpo(toy_model, tmp_path):
    """DPO: 2 processes × 2 pairs == 1 process × 2 pairs × accumulation 2 (a pair never splits; mean over pairs)."""
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join((EXAMPLES / "prefs.jsonl").read_text().splitlines(keepends=True)[:24]))
    dpo = ["--method", "dpo", "--max-steps", "3", "--val-fraction", "0.2", "--batch-size", "2"]
    train_on_one(toy_model, tmp_path / "one", *dpo, "--grad-accum", "2", data=str(data))
    result = train_on_two(toy_model, tmp_path / "two", *dpo, data=str(data))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_weights(tmp_path / "two" / ADAPTER, tmp_path / "one" / ADAPTER, WEIGHTS_ATOL)
    for a, b in zip(metrics(tmp_path / "two"), metrics(tmp_path / "one"), strict=True):
        assert a["pairs"] == b["pairs"] == 4
        for name in ("train_loss", "reward_margin", "chosen_logp", "val_loss", "val_reward_accuracy"):
            assert (name in a) == (name in b)
            if name in a:
                assert a[name] == pytest.approx(b[name], rel=1e-5, abs=1e-7), name
