"""95% intervals for a rate, and for the change of a rate between two models answering the same prompts.

wilson(k, n)                    Wilson's score interval for k successes in n: stays inside [0, 1] and keeps its
                                coverage near 0 and 1, where the textbook normal interval does not.
paired_difference(base, tuned)  the tuned rate minus the base rate, with Newcombe's interval for paired
                                proportions (Newcombe 1998, Statistics in Medicine 17:2635, method 10): it combines
                                the two Wilson intervals with the correlation of the paired outcomes, so prompts
                                both models pass or both fail narrow it, and only prompts whose outcome changed
                                can move it away from 0. No resampling: the same outcomes always give the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # the standard normal's 97.5% point


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion; (0, 1) when there is nothing to measure."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends: rounding leaves 1e-17 there
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def paired_difference(base: Sequence[bool], tuned: Sequence[bool], z: float = Z95) -> dict:
    """tuned rate - base rate on the same items, with Newcombe's paired score interval."""
    if len(base) != len(tuned):
        raise ValueError(f"paired outcomes differ in length: {len(base)} and {len(tuned)}")
    n = len(base)
    if n == 0:
        return {"value": 0.0, "low": -1.0, "high": 1.0, "gained": 0, "lost": 0}
    both = sum(1 for b, t in zip(base, tuned, strict=True) if b and t)
    gained = sum(1 for b, t in zip(base, tuned, strict=True) if t and not b)  # tuned right, base wrong
    lost = sum(1 for b, t in zip(base, tuned, strict=True) if b and not t)  # base right, tuned wrong
    neither = n - both - gained - lost
    p_tuned, p_base = (both + gained) / n, (both + lost) / n
    low_t, high_t = wilson(both + gained, n, z)
    low_b, high_b = wilson(both + lost, n, z)
    # correlation of the paired outcomes (phi of the 2x2 table); 0 when a margin is empty
    margins = (both + gained) * (lost + neither) * (both + lost) * (gained + neither)
    phi = (both * neither - gained * lost) / math.sqrt(margins) if margins else 0.0
    below = (p_tuned - low_t) ** 2 - 2 * phi * (p_tuned - low_t) * (high_b - p_base) + (high_b - p_base) ** 2
    above = (high_t - p_tuned) ** 2 - 2 * phi * (high_t - p_tuned) * (p_base - low_b) + (p_base - low_b) ** 2
    value = p_tuned - p_base
    return {
        "value": value,
        "low": max(-1.0, value - math.sqrt(max(0.0, below))),
        "high": min(1.0, value + math.sqrt(max(0.0, above))),
        "gained": gained,
        "lost": lost,
    }
