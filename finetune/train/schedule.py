"""Learning rate: linear warmup, then linear or cosine decay towards zero at the end of the run.

For the optimizer step with 0-based index i of T steps, W of them warmup:
    i < W:   lr = peak · (i + 1) / W                      (reaches the peak on the last warmup step)
    i >= W:  lr = peak · f((i − W) / (T − W))            f(p) = 1 − p (linear) or (1 + cos πp) / 2
so the first step after warmup runs at the peak and the decay reaches zero exactly after step T.
"""

from __future__ import annotations

import math


def lr_at(step_index: int, total_steps: int, warmup_steps: int, peak: float, kind: str) -> float:
    if step_index < warmup_steps:
        return peak * (step_index + 1) / warmup_steps
    progress = (step_index - warmup_steps) / max(1, total_steps - warmup_steps)
    if kind == "linear":
        return peak * (1.0 - progress)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
