"""The workers registry (db.workers): who is alive, on what device, how fast it measured each model.

store.workers.register(name, host, pid, devices, device_kind, speeds)   # a worker starting
store.workers.heartbeat(name)      # every few seconds (workers/presence.py)
store.workers.live(lease_seconds)  # /healthz, the API's plans (workers/pool.py)
"""

from __future__ import annotations

import time

from sqlalchemy import Engine, delete, insert, or_, select, update

from finetune.service.storage.db import transaction, workers

DAY = 24 * 3600


class WorkerRegistry:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def register(
        self, name: str, host: str, pid: int, devices: int | None, device_kind: str, speeds: dict | None = None
    ) -> None:
        """A worker starting (a name seen before, e.g. a reused pid, starts afresh); goodbyes older than a day go."""
        t = time.time()
        with transaction(self.engine, write=True) as conn:
            conn.execute(delete(workers).where(or_(workers.c.name == name, workers.c.stopped_at < int(t) - DAY)))
            conn.execute(
                insert(workers).values(
                    name=name,
                    host=host,
                    pid=pid,
                    started_at=int(t),
                    last_heartbeat=t,
                    devices=devices,
                    device_kind=device_kind,
                    speeds=speeds or {},
                    draining=False,
                )  # fmt: skip
            )

    def heartbeat(self, name: str, draining: bool = False, waiting: dict | None = None) -> None:
        """`waiting`: what the worker's job waits for now (a Ray cluster's devices), None when nothing."""
        with transaction(self.engine, write=True) as conn:
            conn.execute(
                update(workers)
                .where(workers.c.name == name)
                .values(last_heartbeat=time.time(), draining=draining, waiting=waiting)
            )

    def record_speed(self, name: str, key: str, tokens_per_s: float) -> None:
        """A speed the worker measured (train/speed.py's key without the machine: model, method, length)."""
        with transaction(self.engine, write=True) as conn:
            known = conn.execute(select(workers.c.speeds).where(workers.c.name == name)).scalar() or {}
            conn.execute(update(workers).where(workers.c.name == name).values(speeds={**known, key: tokens_per_s}))

    def live(self, lease_seconds: float) -> list[dict]:
        """Workers that beat within the lease time and have not said goodbye (draining ones included)."""
        with transaction(self.engine, write=False) as conn:
            found = conn.execute(
                select(workers)
                .where(workers.c.stopped_at.is_(None), workers.c.last_heartbeat >= time.time() - lease_seconds)
                .order_by(workers.c.started_at, workers.c.name)
            )
            return [dict(row._mapping) for row in found]

    def forget(self, name: str) -> None:
        """A worker stopping cleanly says goodbye (kept a day, for the last heartbeat it gave)."""
        with transaction(self.engine, write=True) as conn:
            conn.execute(
                update(workers).where(workers.c.name == name).values(stopped_at=int(time.time()), draining=True)
            )
