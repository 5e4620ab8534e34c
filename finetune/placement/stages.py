"""Where each stage of a run ran: its models' devices and precisions, its seconds, its peak GPU memory.

    with recorded_in(out):                       # the spine, `finetune eval`, the demo: where the lines go
        with stage("training") as seen:
            seen.model(model)                    # the devices and dtypes its weights are on
            ...                                  # -> one line of OUT/stages.jsonl when the stage ends

Each line: {"stage", "devices", "dtypes", "seconds", "peak_gpu_bytes"}. bench/gpu_demo.sh reads them to show a GPU run
stage by stage, and to fail when any model of the run sat on the CPU. Nothing is written outside a `recorded_in`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import time
from collections.abc import Iterator
from pathlib import Path

from finetune.placement.where import where

STAGES_FILE = "stages.jsonl"
_FOLDER: contextvars.ContextVar[Path | None] = contextvars.ContextVar("finetune_stages", default=None)


@contextlib.contextmanager
def recorded_in(folder: Path | None) -> Iterator[None]:
    """The stages inside are appended to FOLDER/stages.jsonl (None: not recorded)."""
    token = _FOLDER.set(Path(folder) if folder is not None else None)
    try:
        yield
    finally:
        _FOLDER.reset(token)


class Seen:
    """What one stage ran: the devices and dtypes of every model shown to it."""

    def __init__(self) -> None:
        self.devices: set[str] = set()
        self.dtypes: dict[str, int] = {}

    def model(self, model) -> None:
        found = where(model)
        self.devices |= set(found["devices"])
        for name, count in found["dtypes"].items():
            self.dtypes[name] = max(self.dtypes.get(name, 0), count)


@contextlib.contextmanager
def stage(name: str) -> Iterator[Seen]:
    """Time one stage and note its models; a line of stages.jsonl when it ends (inside `recorded_in`)."""
    import torch  # torch: a stage runs models

    folder, seen = _FOLDER.get(), Seen()
    if _cuda_in_use(torch):
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    yield seen
    if folder is None:
        return
    line = {
        "stage": name,
        "devices": sorted(seen.devices),
        "dtypes": seen.dtypes,
        "seconds": round(time.perf_counter() - started, 2),
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if _cuda_in_use(torch) else None,
    }
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / STAGES_FILE).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def _cuda_in_use(torch) -> bool:
    """A CUDA context exists in this process (a model was placed on a GPU): its memory statistics can be read."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()
