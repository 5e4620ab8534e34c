"""The table of Idempotency-Key answers (db.idempotency_keys): a key held for a request, the answer stored for it,
given back when the request failed. What a request with a key gets is decided in api/idempotency.py.

first = store.idempotency.begin(tenant, key, route, body_sha256)   # None: a new key, held for this request
store.idempotency.finish(tenant, key, route, object_id, answer)    # or drop(...) when the request failed
"""

from __future__ import annotations

import time

from sqlalchemy import Engine, delete, insert, select, update

from finetune.service.storage.db import idempotency_keys, transaction

DAY = 24 * 3600
ABANDONED_S = 600  # a request that held its key this long without an answer died: a retry redoes it


class IdempotencyKeys:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def begin(self, tenant: str, key: str, route: str, body_sha256: str) -> dict | None:
        """Hold `key` for this request; None when it is new (go on, then finish or drop).
        Otherwise the row of the first request with that key (its `response` is None while that one runs).
        Keys live a day; one whose request never finished is taken over after ABANDONED_S."""
        t = int(time.time())
        with transaction(self.engine, write=True) as conn:
            mine = (
                idempotency_keys.c.tenant == tenant,
                idempotency_keys.c.key == key,
                idempotency_keys.c.route == route,
            )
            found = conn.execute(select(idempotency_keys).where(*mine)).first()
            row = dict(found._mapping) if found is not None else None
            expired = row is not None and (
                row["created_at"] < t - DAY or (row["response"] is None and row["created_at"] < t - ABANDONED_S)
            )
            if row is not None and not expired:
                return row
            if row is not None:
                conn.execute(delete(idempotency_keys).where(*mine))
            conn.execute(
                insert(idempotency_keys).values(
                    tenant=tenant, key=key, route=route, body_sha256=body_sha256, created_at=t
                )
            )
            return None

    def finish(self, tenant: str, key: str, route: str, object_id: str, response: dict) -> None:
        with transaction(self.engine, write=True) as conn:
            conn.execute(
                update(idempotency_keys)
                .where(
                    idempotency_keys.c.tenant == tenant,
                    idempotency_keys.c.key == key,
                    idempotency_keys.c.route == route,
                )
                .values(object_id=object_id, response=response)
            )

    def drop(self, tenant: str, key: str, route: str) -> None:
        """The request failed: a retry with the same key may try again."""
        with transaction(self.engine, write=True) as conn:
            conn.execute(
                delete(idempotency_keys).where(
                    idempotency_keys.c.tenant == tenant,
                    idempotency_keys.c.key == key,
                    idempotency_keys.c.route == route,
                    idempotency_keys.c.response.is_(None),
                )
            )
