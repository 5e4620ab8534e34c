"""One verdict over the several measures of one check (issue 47): an exact paired test per measure, and Holm's
step-down across them, so that a model with no real change is flagged at most 5% of the time by the check as a whole.

    p = sign_test(differences, "drop")          # exact one-sided p of the paired sign-flip test
    decided = holm({"accuracy": 0.004, ...})     # {name: {"p", "p_holm", "rejected"}}: family-wise 5%
    change = cluster_bootstrap(base_rows, tuned_rows, seed=0)   # a share's change over items that come in clusters

The retention check tests six measures (five rates for a drop, the team's voice for a rise) and the answers' check
two (invented specifics against the team's replies, recitals against the base), each one-sided. Tested one by one at
2.5% each, a model that changed nothing was flagged in up to 14% of checks (1 - 0.975^6); with Holm's correction
(Holm 1979, Scandinavian Journal of Statistics 6:65; valid for any dependence between the measures) at most 5%.

The test of one measure is the paired sign-flip test: with no change, each item's difference (tuned minus base: -1, 0
or +1 for one outcome per item; for the instructions of one answer, the count kept by the tuned model minus the base's)
is as likely to be negative as positive, so the sum's distribution is computed exactly over every flip of the non-zero
differences. For one outcome per item it is McNemar's exact test (the binomial test of the items lost against those
gained); for instructions it keeps the instructions of one answer together (they are not independent: one rambling
answer breaks several at once). Exact tests of counts are conservative: the false-flag rate is at most 5%, often
below (tests/unit/ship/eval/test_family.py simulates it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FAMILY_ALPHA = 0.05  # the share of checks of an unchanged model that may be flagged, all measures together
BOOTSTRAP_DRAWS = 2000
SEED = 0  # the cluster bootstrap's: the same outcomes always give the same interval


def sign_test(differences: Sequence[int], direction: str) -> float:
    """The exact one-sided p-value that the differences sum this low ("drop") or this high ("rise") when each
    non-zero difference is as likely to have either sign."""
    sizes = [abs(int(d)) for d in differences if d]
    if not sizes:
        return 1.0
    total = sum(sizes)
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    for size in sizes:  # the support stays within [-total, total]: np.roll never wraps
        dist = 0.5 * (np.roll(dist, size) + np.roll(dist, -size))
    at = int(sum(differences)) + total
    tail = dist[: at + 1].sum() if direction == "drop" else dist[at:].sum()
    return float(min(1.0, tail))


def paired_p(change: dict, direction: str) -> float:
    """`sign_test` of one outcome per item, from a change's counts (intervals.paired_difference: gained, lost)."""
    return sign_test([1] * change["gained"] + [-1] * change["lost"], direction)


def holm(pvalues: dict[str, float], alpha: float = FAMILY_ALPHA) -> dict[str, dict]:
    """Holm's step-down: the k-th smallest of m p-values is compared with alpha / (m - k + 1), and every hypothesis
    after the first one kept is kept too. Per name: its p, its Holm-adjusted p (the smallest family-wise level at
    which it would be rejected) and whether it is rejected at `alpha`."""
    decided, running, m = {}, 0.0, len(pvalues)
    for k, name in enumerate(sorted(pvalues, key=lambda n: (pvalues[n], n))):
        running = max(running, min(1.0, (m - k) * pvalues[name]))
        decided[name] = {"p": pvalues[name], "p_holm": running, "rejected": running <= alpha}
    return decided


def cluster_bootstrap(
    base_rows: Sequence[Sequence[bool]], tuned_rows: Sequence[Sequence[bool]], seed: int = SEED,
    draws: int | None = None,
) -> dict:  # fmt: skip
    """The change of a share of items that come in clusters (the instructions of one answer), with a 95% percentile
    interval from resampling whole clusters (seeded: the same outcomes give the same interval); `gained` and `lost`
    count items, `clusters` the clusters."""
    sizes = np.array([len(row) for row in base_rows], dtype=float)
    base = np.array([sum(row) for row in base_rows], dtype=float)
    tuned = np.array([sum(row) for row in tuned_rows], dtype=float)
    flat = [(b, t) for rb, rt in zip(base_rows, tuned_rows, strict=True) for b, t in zip(rb, rt, strict=True)]
    counts = {"gained": sum(1 for b, t in flat if t and not b), "lost": sum(1 for b, t in flat if b and not t)}
    if not sizes.sum():
        return {"value": 0.0, "low": -1.0, "high": 1.0, **counts, "clusters": 0}
    picks = np.random.default_rng(seed).integers(0, len(sizes), size=(draws or BOOTSTRAP_DRAWS, len(sizes)))
    shares = (tuned[picks].sum(axis=1) - base[picks].sum(axis=1)) / np.maximum(sizes[picks].sum(axis=1), 1.0)
    low, high = np.percentile(shares, [2.5, 97.5])
    value = float((tuned.sum() - base.sum()) / sizes.sum())
    return {"value": value, "low": float(low), "high": float(high), **counts, "clusters": len(sizes)}
