"""Loss spikes: a step whose training loss jumps far above the running mean of the steps before it.

    watch = SpikeWatch()
    if watch.observe(loss):           # True: this step's loss is a spike (a warning in metrics.jsonl)
        row["warning"] = LOSS_SPIKE
    find_spikes([2.1, 2.0, 1.9, 25.0])  # -> [3] (indices), what the report's diagnosis reads

The running mean covers the last WINDOW finite losses and needs MIN_HISTORY of them before it judges,
so the noisy first steps never count. A spike is reported, not acted on: the run goes on, the
diagnosis calls it unstable. Non-finite losses are the NaN guard's business, not this one's.
"""

from __future__ import annotations

import math
from collections import deque

LOSS_SPIKE = "loss_spike"
SPIKE_FACTOR = 10.0  # "far above": ten times the running mean
WINDOW = 50
MIN_HISTORY = 3


class SpikeWatch:
    """Feed it each step's training loss in order; it says which ones are spikes."""

    def __init__(self, history: list[float] | None = None) -> None:
        self._recent: deque[float] = deque(maxlen=WINDOW)
        for loss in history or []:  # the losses before a resume: the judgement continues where it stopped
            self.observe(loss)

    def observe(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return False
        spike = len(self._recent) >= MIN_HISTORY and loss > SPIKE_FACTOR * self.mean
        if not spike:  # a spike stays out of the mean, so a second one right after is still seen
            self._recent.append(loss)
        return spike

    @property
    def mean(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else math.nan


def find_spikes(losses: list[float]) -> list[int]:
    """Indices of the losses that SpikeWatch calls spikes."""
    watch = SpikeWatch()
    return [i for i, loss in enumerate(losses) if watch.observe(loss)]
