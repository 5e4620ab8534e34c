"""`finetune train ... --devices N`: start N local processes through torchrun's launcher.

    finetune train data.jsonl --model M --out OUT --devices 2
    # does what this does:
    torchrun --standalone --nproc-per-node 2 -m finetune train data.jsonl --model M --out OUT --devices 2

torchrun's elastic agent starts the workers (each runs `python -m finetune` with the same arguments and
finds RANK / WORLD_SIZE in its environment), forwards SIGTERM / SIGINT to them (each saves a checkpoint
at the next step boundary and stops), and stops all of them as soon as one fails. Each worker writes its
failure to torchelastic's error file (distributed.rank_failures); this module prints the one that came
first, with its rank, instead of torchelastic's report of every rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator

import torch

from finetune.settings.errors import UserError
from finetune.settings.wording import ref

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_SHUTDOWN_TIMEOUT_S = 120  # after a stop signal, time the workers get to finish a step and checkpoint


def launch_local(nproc: int, argv: list[str]) -> int:
    """Run `finetune <argv>` in `nproc` local processes; the exit code of the whole run."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise UserError(
            f"{ref('devices', nproc)}, but this machine has {torch.cuda.device_count()} GPU(s); to train on several "
            "machines, start torchrun on each of them (docs/distributed.md)"
        )
    # one process per device must not each start a thread per core (torchrun would set 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    log_dir = tempfile.mkdtemp(prefix="finetune-launch-")  # torchelastic's per-rank error files
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        role="finetune",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, like torchrun --standalone
        max_restarts=0,  # a failed rank ends the run: a restart would fail the same way
        monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        shutdown_timeout=int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT_S)),
    )
    try:
        with _quiet_torchelastic():
            elastic_launch(config, entrypoint=sys.executable)("-u", "-m", "finetune", *argv)
    except ChildFailedError as failed:
        return _report_failure(failed.failures)
    except SignalException as stop:  # the workers were sent the same signal, checkpointed and said so
        return 128 + int(stop.sigval)
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


@contextlib.contextmanager
def _quiet_torchelastic() -> Iterator[None]:
    """torchelastic's warnings repeat what the workers and _report_failure say; each of its modules has a logger
    with its own level, so each is raised for the launch and restored after."""
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch.distributed.elastic")
    ]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def _report_failure(failures: dict) -> int:
    """Print the failure that came first, with its rank; the exit code for the whole run.

    A rank that only lost contact with the others is a consequence, not a cause: the cause is the earliest
    other failure, recorded by our code or, without a record, a process that died (killed, out of memory).
    """
    ours = {rank: f.error_file_data["finetune"] for rank, f in failures.items() if "finetune" in f.error_file_data}
    unrecorded = {rank: f for rank, f in failures.items() if rank not in ours}
    if not ours and {f.exitcode for f in unrecorded.values()} <= {128 + s for s in STOP_SIGNALS}:
        return next(iter(unrecorded.values())).exitcode  # stopped by a signal sent to the workers themselves
    causes = {rank: record for rank, record in ours.items() if not record.get("lost_contact")}
    if causes or not unrecorded:
        candidates = causes or ours
        rank = min(candidates, key=lambda r: candidates[r]["time"])
        print(f"error: rank {rank} failed first: {ours[rank]['message']}", file=sys.stderr)
        if not ours[rank]["user_error"]:
            print(f"  its traceback: {failures[rank].error_file}", file=sys.stderr)
        return 1
    rank = min(unrecorded, key=lambda r: (unrecorded[r].timestamp, r))
    failure = unrecorded[rank]
    how = f"was killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exited with {failure.exitcode}"
    print(f"error: rank {rank} {how} (its output is above)", file=sys.stderr)
    return 1
