"""The devices the service's jobs run on: its live workers (db.workers), for plans made in the API process.

    where = pool_for(store, options, devices=1)
    where.device_kind     # "cpu", "h100-80gb", ... of a live worker that can run the job (None: none can)
    where.speed_of        # its measured training speeds (train/speed.py), for the plan's time estimate
    where.problem         # why no worker can run it, in one sentence (None when one can)

A job's plan in the API (POST /v1/fine_tuning/plan, the dashboard's New job page) is sized for the worker pool,
never for an assumed device; the worker that takes the job plans it again on its own machine, measuring the
model's speed there when it has not yet, and reports that speed back for the next plans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from finetune.service.options import ServiceOptions
from finetune.service.storage.store import Store


@dataclass(frozen=True)
class Pool:
    device_kind: str | None
    speeds: dict[str, float]
    problem: str | None

    def speed_of(self, model: str, trained_weights: str, seq_len: int) -> float | None:
        from finetune.train.speed import speed_key  # torch: train/speed.py imports it

        return self.speeds.get(speed_key(model, trained_weights, seq_len))


def pool_for(store: Store, options: ServiceOptions, devices: int) -> Pool:
    """Where a job of `devices` devices would run: the live workers able to take it, the one with measurements
    first (its device and speeds size the plan)."""
    live = store.workers.live(options.lease_seconds)
    able = [w for w in live if not w["draining"] and (w["devices"] is None or w["devices"] >= devices)]
    if not able:
        problem = (
            "no worker is running, so the job would wait in the queue until one starts"
            if not live
            else f"no live worker has {devices} device(s) (they have {_devices(live)}), so the job would wait "
            "in the queue until one that has them starts"
        )
        return Pool(None, {}, problem)
    chosen = max(able, key=lambda w: len(w["speeds"] or {}))
    return Pool(chosen["device_kind"], dict(chosen["speeds"] or {}), None)


def _devices(workers: list[dict]) -> str:
    counts = sorted({w["devices"] for w in workers if w["devices"] is not None})
    return ", ".join(map(str, counts)) or "any number of CPU processes"


SpeedOf = Callable[[str, str, int], float | None]
