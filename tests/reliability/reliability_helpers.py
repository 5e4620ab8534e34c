"""Helpers for the reliability tests: a small LoRA model with an optimizer, checkpoints saved for real,
files damaged on disk, and the command line run as a subprocess (so tracebacks would show)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from finetune.train.checkpoint import TrainState, save_checkpoint

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAIN = EXAMPLES / "train.jsonl"
# Three steps of 4 records on the toy model, a checkpoint after each: a run takes a few seconds.
FAST = ["--epochs", "1", "--batch-size", "4", "--max-steps", "3", "--max-seq-len", "256", "--save-every", "1",
        "--val-fraction", "0.1", "--seed", "1"]  # fmt: skip
FAST_CONFIG = dict(epochs=1, batch_size=4, max_steps=3, max_seq_len=256, save_every=1, val_fraction=0.1, seed=1)


def train_in_process(
    model: Path, out: Path, data: Path = TRAIN, show=None, on_step=None, objective=None, **settings
) -> dict:
    """The library call behind `finetune train` (no new interpreter: the tests stay fast); report.json's content.
    `show` gets every note the run logs (the command line prints them on stderr)."""
    import logging

    from finetune.run import train
    from finetune.settings.config import RunConfig

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            show(record.getMessage())

    logger, handler = logging.getLogger("finetune"), Collect()
    if show:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    config = RunConfig(data=str(data), model=str(model), out=str(out), **{**FAST_CONFIG, **settings})
    try:
        return train(config, on_step=on_step, objective=objective).report
    finally:
        logger.removeHandler(handler)


def save_steps(out: Path, lora, steps: list[int]) -> list[Path]:
    model, optimizer = lora
    return [save_checkpoint(out, model, optimizer, TrainState(step=step), is_lora=True) for step in steps]


def train_command(model: Path, out: Path, *extra: str, data: Path = TRAIN) -> list[str]:
    return [sys.executable, "-m", "finetune", "train", str(data), "--model", str(model), "--out", str(out), *FAST,
            *extra]  # fmt: skip


def run_cli(*args: str, bootstrap: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m finetune ARGS`, or the same after running `bootstrap` (a fault to inject) in the child."""
    if bootstrap is None:
        command = [sys.executable, "-m", "finetune", *args]
    else:
        code = f"import sys\n{bootstrap}\nfrom finetune.commands.cli import main\nsys.exit(main(sys.argv[1:]))"
        command = [sys.executable, "-c", code, *args]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def cli(*args: str) -> subprocess.CompletedProcess:
    """`finetune ARGS` in this process (no interpreter start-up: fast); an exception escaping main() fails the
    test just as a traceback would. Output is captured like a subprocess's."""
    import contextlib
    import io

    from finetune.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def assert_clean_failure(result: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 1, no traceback, and every word in the message."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def weights_finite(folder: Path) -> bool:
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t).all()) for f in folder.glob("*.safetensors") for t in load_file(f).values())
