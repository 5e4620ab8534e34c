"""The audit trail's records: one per write or download (audit_http.py records the API's and the dashboard's, the
command line its key changes), append-only, each chained to the one before it:

    hash = sha256(previous record's hash + canonical JSON of this record's fields)      (the first: 64 zeros)

where canonical JSON is the fields of FIELDS, keys sorted, no spaces, UTF-8. `seq` counts from 1 with no gap. A
record changed by hand no longer matches its hash, a deleted one leaves a gap and breaks the next hash: verify()
names the first bad record. The chain is taken under the write lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: an
advisory lock), so concurrent writers queue and never fork it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select, text

from finetune.service.storage.db import audit_records, is_postgres, transaction
from finetune.service.storage.store import Page, cursor_number, now

FIELDS = (
    "seq", "created_at", "tenant", "key_id", "action", "object_id", "source", "via", "method", "route", "status",
    "outcome",
)  # fmt: skip
GENESIS = "0" * 64
ID_PREFIX = "audit-"
CHAIN_LOCK = 7254005  # PostgreSQL's advisory lock around the chain's head (migrate's is 7254001)
# the most a record keeps of each field: a record's size is bounded whatever a request names (a 60 KB path parameter)
LIMITS = {"tenant": 128, "key_id": 32, "action": 64, "object_id": 256, "source": 255, "via": 16, "method": 8,
          "route": 256, "outcome": 16}  # fmt: skip


def canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(
        {k: record[k] for k in FIELDS}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


def chain_hash(previous: str, record: dict[str, Any]) -> str:
    return hashlib.sha256(previous.encode("ascii") + canonical(record)).hexdigest()


def outcome_of(status: int) -> str:
    return "ok" if status < 400 else "refused" if status < 500 else "failed"


def audit_object(record: dict[str, Any]) -> dict[str, Any]:
    """A record as the API answers it (GET /v1/audit)."""
    return {"object": "audit.record", "id": f"{ID_PREFIX}{record['seq']}"} | {k: record[k] for k in (*FIELDS, "hash")}


@dataclass
class Verdict:
    records: int  # checked
    head_seq: int | None  # the last record's (None: the trail is empty)
    head_hash: str | None
    bad_seq: int | None = None  # the first bad record (None: the chain holds)
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


class AuditLog:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def append(
        self,
        action: str,
        *,
        tenant: str | None = None,
        key_id: str | None = None,
        object_id: str | None = None,
        source: str = "cli",
        via: str = "cli",
        method: str | None = None,
        route: str | None = None,
        status: int | None = None,
        outcome: str = "ok",
    ) -> dict[str, Any]:
        """Add one record at the chain's head; returns it (with its seq and hash)."""
        values = dict(tenant=tenant, key_id=key_id, action=action, object_id=object_id, source=source, via=via,
                      method=method, route=route, status=status, outcome=outcome)  # fmt: skip
        for name, size in LIMITS.items():
            if isinstance(values[name], str):
                values[name] = values[name][:size]
        with transaction(self.engine, write=True) as conn:
            if is_postgres(self.engine):
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CHAIN_LOCK})
            head = conn.execute(
                select(audit_records.c.seq, audit_records.c.hash).order_by(audit_records.c.seq.desc()).limit(1)
            ).first()
            record = values | {"seq": head.seq + 1 if head else 1, "created_at": now()}
            record["hash"] = chain_hash(head.hash if head else GENESIS, record)
            conn.execute(insert(audit_records).values(**record))
        return record

    def page(self, tenant: str, after: str | None, limit: int, ascending: bool = False) -> Page:
        """The tenant's records, newest first (or oldest first); `after` = the id of the previous page's last."""
        query = select(audit_records).where(audit_records.c.tenant == tenant)
        if after is not None:
            anchor = cursor_number(after, ID_PREFIX)
            if anchor is None:
                return Page([], False)  # an unknown cursor: an empty page, as the other lists answer
            seq = audit_records.c.seq
            query = query.where(seq > anchor if ascending else seq < anchor)
        order = audit_records.c.seq.asc() if ascending else audit_records.c.seq.desc()
        with transaction(self.engine) as conn:
            rows = [dict(r._mapping) for r in conn.execute(query.order_by(order).limit(limit + 1))]
        return Page(rows[:limit], len(rows) > limit)

    def records(self, since: int | None = None, tenant: str | None = None, batch: int = 1000) -> Iterator[dict]:
        """Every record (of `tenant`; created at or after `since`), oldest first, read in batches."""
        last = 0
        while True:
            query = select(audit_records).where(audit_records.c.seq > last)
            if since is not None:
                query = query.where(audit_records.c.created_at >= since)
            if tenant is not None:
                query = query.where(audit_records.c.tenant == tenant)
            with transaction(self.engine) as conn:
                rows = [dict(r._mapping) for r in conn.execute(query.order_by(audit_records.c.seq).limit(batch))]
            yield from rows
            if len(rows) < batch:
                return
            last = rows[-1]["seq"]

    def verify(self, noted: tuple[int, str] | None = None) -> Verdict:
        """Walk the whole chain: every seq present from 1, every hash what its record and the one before make.
        `noted`: a (seq, hash) kept elsewhere earlier; that record must still be there with that hash (a chain
        cut short, or rewritten from its start, holds together, but not that)."""
        previous, expected, count = GENESIS, 1, 0
        for record in self.records():
            if record["seq"] != expected:
                after = f"record {expected - 1} is followed by record {record['seq']}" if expected > 1 else (
                    f"the trail starts at record {record['seq']}")  # fmt: skip
                return Verdict(count, expected - 1 or None, previous, expected,
                               f"record {expected} is missing ({after}): it was deleted")  # fmt: skip
            if chain_hash(previous, record) != record["hash"]:
                problem = f"record {expected} ({record['action']}) does not match its hash: it was changed"
                if expected > 1:
                    problem += f", or record {expected - 1}'s hash was"
                return Verdict(count, expected - 1 or None, previous, expected, problem)
            if noted is not None and noted[0] == expected and noted[1] != record["hash"]:
                return Verdict(count, expected - 1 or None, previous, expected,
                               f"record {expected}'s hash is not the one noted ({noted[1]}): the trail was rewritten")  # fmt: skip
            previous, expected, count = record["hash"], expected + 1, count + 1
        if noted is not None and noted[0] >= expected:
            return Verdict(count, count or None, previous if count else None, noted[0],
                           f"record {noted[0]} is gone (the trail ends at record {count}): it was cut short")  # fmt: skip
        return Verdict(count, count or None, previous if count else None)
