"""Checks that keep a run from wasting time or writing something it cannot trust.

check_out_folder(out)                 # before the tokenizer loads: a file, or a folder we cannot write
finished = finished_report(out, n)    # --resume of a run that already ended: its report, nothing to do
nonfinite_weights(params, ctx)        # after each update: a NaN or inf weight must never reach a checkpoint
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

import torch

from finetune.settings.errors import UserError
from finetune.settings.wording import ref
from finetune.train.checkpoint import last_good_step, list_checkpoints, read_state
from finetune.train.distributed import DistContext, all_reduce_sum


def check_out_folder(out: Path) -> None:
    """--out must be a folder this process can write to (it is created when missing)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{ref('out')} {out} is a file, not a folder; choose a folder for the run's outputs")
    probe = out / f".finetune-write-check-{os.getpid()}"
    created = [p for p in (out, *out.parents) if not p.exists()]  # made for the probe, removed after it
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(
            f"{ref('out')} {out}: cannot write there ({exc.strerror or exc}); choose a folder you can write to"
        ) from None
    finally:
        for folder in created:  # a run that fails later (bad data) must not leave an empty folder behind
            with contextlib.suppress(OSError):
                folder.rmdir()


def finished_report(out: Path, total_steps: int) -> dict | None:
    """report.json's content when OUT holds a run that ended at `total_steps` (its last checkpoint is that
    step and the report and the final weights are written); None when there is something left to do."""
    found = list_checkpoints(out)
    report_path = out / "report.json"
    if not found or not report_path.is_file():
        return None
    try:
        done = read_state(found[-1]).step
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    weights = report.get("final_weights") if isinstance(report, dict) else None
    if done != total_steps or not weights or not Path(weights).is_dir():
        return None
    return report


def finished_message(out: Path, report: dict) -> str:
    steps = report.get("steps_taken")
    return (
        f"{out} holds a finished run ({steps} of {steps} steps; weights in {report.get('final_weights')}): "
        f"nothing to resume, and nothing was changed. Choose another {ref('out')} to train again."
    )


def nonfinite_weights(params: list[torch.nn.Parameter], ctx: DistContext) -> bool:
    """True when any trainable weight on any rank is NaN or infinite (every rank gets the same answer)."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():  # a sharded weight is checked shard by shard, each rank its own
        bad = sum(int((~torch.isfinite(p.to_local() if isinstance(p, DTensor) else p)).any()) for p in params)
    return bool(all_reduce_sum(torch.tensor([float(bad)], dtype=torch.float64), ctx)[0] > 0)


def diverged_message(what: str, step: int, out: Path, lr: float) -> str:
    """One sentence: what went wrong at which step, and the checkpoint to go back to (always a finite one)."""
    found = list_checkpoints(out)
    where = f"the last good checkpoint is {found[-1]}" if found else "no checkpoint was saved yet"
    return f"{what} at step {step}; the step was not saved and {where}. Try a lower {ref('lr')} (now {lr:g}) or check the data."


def disk_full_error(exc: OSError, out: Path) -> UserError | None:
    """A full disk outside a checkpoint save (metrics, plan, export) as one line; None for any other error."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return UserError(
        f"disk full while writing {exc.filename or out}; {last_good_step(out)}. "
        f"Free some space and run the same command with {ref('resume')}."
    )
