"""The tables and the schema step, over SQLite (WAL) or PostgreSQL, through SQLAlchemy Core.

Migrations are a short list of versioned steps (`MIGRATIONS`) recorded in `schema_version`, applied at
every start of serve, worker and keys under a lock (PostgreSQL: an advisory lock; SQLite: BEGIN
IMMEDIATE), so several workers starting together apply each step exactly once. Alembic would add a
dependency, an ini file and an env.py for seven tables; a new step here is one function appended to the list.

Every write transaction on SQLite starts with BEGIN IMMEDIATE: it takes the write lock up front, so two
workers claiming at once queue on busy_timeout instead of failing on a lock upgrade.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    false,
    inspect,
    text,
)

metadata = MetaData()

# `row` columns are the order of creation (ids are random); lists page on them.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(32), primary_key=True),  # the public part of a key, shown by `keys list`
    Column("tenant", String(128), nullable=False),
    Column("hash", String(64), nullable=False),  # sha256 of the whole key; the key itself is never stored
    Column("created_at", BigInteger, nullable=False),
    Column("revoked_at", BigInteger),
)

files = Table(
    "files",
    metadata,
    Column("row", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("tenant", String(128), nullable=False, index=True),
    Column("filename", Text, nullable=False),  # shown only: the bytes live at files/<id>
    Column("purpose", String(32), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("row", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("tenant", String(128), nullable=False, index=True),
    Column("model", Text, nullable=False),  # the registered name the job asked for
    Column("model_location", Text, nullable=False),  # what that name meant when the job was created
    Column("training_file", String(64), nullable=False),
    Column("validation_file", String(64)),
    Column("suffix", String(64)),
    Column("seed", BigInteger, nullable=False),
    Column("metadata", JSON),
    Column("method", JSON, nullable=False),  # {"type": "supervised", "supervised": {"hyperparameters": {...}}}
    Column("run_settings", JSON, nullable=False),  # RunConfig settings from the hyperparameters and the server
    Column("lr_multiplier", Float),
    Column("resolved", JSON),  # the plan's numbers once planned
    Column("status", String(32), nullable=False, index=True),
    Column("error", JSON),
    Column("created_at", BigInteger, nullable=False),
    Column("finished_at", BigInteger),
    Column("estimated_finish", BigInteger),
    Column("fine_tuned_model", Text),
    Column("trained_tokens", BigInteger),
    Column("result_files", JSON),
    Column("report", JSON),
    # ---- the workers' bookkeeping
    Column("attempts", Integer, nullable=False, default=0),  # trainer starts (first run, resumes)
    Column("claim_token", String(64)),  # the current holder's; every worker write must carry it
    Column("worker", String(128)),
    Column("lease_expires_at", Float),
    Column("events_step", Integer, nullable=False, default=0),  # metrics rows up to here are events already
    Column("death_step", Integer),  # the step the trainer last died at
    Column("deaths_at_step", Integer, nullable=False, default=0),
    Column("devices", Integer, nullable=False, default=1, server_default="1"),  # what the job trains on (v2)
    Column("model_deleted_at", BigInteger),  # DELETE /v1/models/{fine_tuned_model} (v3)
    # ---- usage (v4): the estimate when planned, the actual as it runs (usage.py), the prices planned at
    Column("started_at", BigInteger),  # its trainer first started (the queue wait ends)
    Column("estimate_billed_tokens", BigInteger),
    Column("estimate_device_seconds", Float),
    Column("device_seconds", Float),  # its trainers' time (every attempt) x its devices, so far
    Column("price_per_million_tokens", Float),
    Column("gpu_hour_price", Float),
    # ---- a deleted job (v5): its row stays as a tombstone recording what was removed and when (deletion.py)
    Column("deleted_at", BigInteger),
    Column("removed", JSON),  # [{"what": ..., "bytes": ...}, ...]
    # ---- (v10) the upload its hyperparameter general_data names (a file id); the run gets the stored upload's path
    Column("general_data_file", String(64)),
)
# the columns of jobs that name an upload the job reads: a file is in use while a job that has not ended names it
JOB_FILE_COLUMNS = ("training_file", "validation_file", "general_data_file")

events = Table(
    "events",
    metadata,
    Column("row", Integer, primary_key=True, autoincrement=True),  # the id: ftevent-<row>, monotonic
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("level", String(8), nullable=False),
    Column("type", String(16), nullable=False),
    Column("message", Text, nullable=False),
    Column("data", JSON),
    Index("events_job_row", "job_id", "row"),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("row", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("step", Integer, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("metrics", JSON),
    UniqueConstraint("job_id", "step"),
)

# The workers alive (v3): each registers when it starts and beats every few seconds; "live" = a beat within the
# lease time. /healthz counts them; plans can read what a job will run on (devices, device_kind, its speed).
workers = Table(
    "workers",
    metadata,
    Column("name", String(128), primary_key=True),  # host:pid, as in jobs.worker
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("last_heartbeat", Float, nullable=False),
    Column("devices", Integer),  # the devices a job may use on it (None: any number of CPU processes)
    Column("device_kind", String(64), nullable=False),  # "cpu", "h100-80gb", ...
    Column("speeds", JSON),  # training tokens/s of one device it measured, by model, method and length (speed.py)
    Column("draining", Boolean, nullable=False, default=False, server_default=false()),  # stopping: takes no job
    Column("stopped_at", BigInteger),  # it said goodbye (a killed worker just stops beating)
    Column("waiting", JSON),  # what its job waits for now: {"job", "message", "since"} (v5; /readyz)
)

# Idempotency-Key of a POST (v3): the same key and body within a day answer the first answer again.
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("tenant", String(128), nullable=False),
    Column("key", String(255), nullable=False),
    Column("route", String(64), nullable=False),
    Column("body_sha256", String(64), nullable=False),
    Column("object_id", String(64)),  # what the first request made; None while it runs
    Column("response", JSON),  # the first answer, replayed as it was
    Column("created_at", BigInteger, nullable=False),
    UniqueConstraint("tenant", "key", "route"),
)

# The audit trail (v5; audit_trail.py): one row per write or download, append-only, each row's hash chained to the one
# before it. `seq` is given under the write lock (never a sequence's number), so a gap is a deleted record.
audit_records = Table(
    "audit_records",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("created_at", BigInteger, nullable=False),
    Column("tenant", String(128)),  # None: the caller was not signed in (a refused key)
    Column("key_id", String(32)),  # the public part of the key; never the key
    Column("action", String(64), nullable=False),  # file.upload, job.cancel, model.download, key.create, ...
    Column("object_id", Text),
    Column("source", String(255), nullable=False),  # the caller's address, or "cli"
    Column("via", String(16), nullable=False),  # api | dashboard | cli
    Column("method", String(8)),
    Column("route", Text),  # the route's template, never the path with its ids
    Column("status", Integer),  # the HTTP status answered (None: the command line)
    Column("outcome", String(16), nullable=False),  # ok | refused | failed
    Column("hash", String(64), nullable=False),  # sha256(previous record's hash + this record's canonical JSON)
    Index("audit_records_tenant_seq", "tenant", "seq"),
)

# Quotas per tenant (v8; quotas.py), set by the operator (`finetune serve tenants set`): NULL = no quota of that kind.
# The row of tenant "*" is the default of every tenant without its own value.
tenant_quotas = Table(
    "tenant_quotas",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("max_running_jobs", Integer),  # jobs a worker holds at once (validating, planning, training)
    Column("max_queued_jobs", Integer),  # jobs waiting for a worker
    Column("max_stored_bytes", BigInteger),  # its files (uploads and results files)
    Column("max_monthly_tokens", BigInteger),  # billed tokens of the jobs created in a UTC calendar month
    Column("updated_at", BigInteger, nullable=False),
)

# What a job not yet planned holds against its tenant's monthly tokens (v8): its file's estimate when it was created
# (the plan's `estimate_billed_tokens` takes over once planned).
job_token_holds = Table(
    "job_token_holds",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("tokens", BigInteger, nullable=False),
)

# Evaluations of succeeded jobs (v9; evaluations.py): `finetune eval RUN [--retention]` run by a worker, claimed with a
# lease like a job; `results` holds numbers only (no prompt or answer: those stay in the run folder's files).
evaluations = Table(
    "evaluations",
    metadata,
    Column("row", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("tenant", String(128), nullable=False, index=True),
    Column("retention", Boolean, nullable=False),  # the retention check (the general set)
    Column("test", Boolean, nullable=False),  # the run's held-out test set
    Column("status", String(16), nullable=False),  # queued | running | succeeded | failed
    Column("estimate", JSON),  # {"seconds", "how", ...}: an estimate made when it was created
    Column("created_at", BigInteger, nullable=False),
    Column("started_at", BigInteger),
    Column("finished_at", BigInteger),
    Column("results", JSON),
    Column("error", JSON),
    Column("attempts", Integer, nullable=False, default=0),  # starts of its command (a dead worker's is retried)
    Column("claim_token", String(64)),
    Column("worker", String(128)),
    Column("lease_expires_at", Float),
    Index("evaluations_job_row", "job_id", "row"),
)

schema_version = Table("schema_version", MetaData(), Column("version", Integer, nullable=False))


def _v1(conn: Connection) -> None:
    metadata.create_all(conn)


def _v2(conn: Connection) -> None:
    """jobs.devices: the devices a job trains on, so that a worker only takes the jobs its machine can run."""
    if "devices" not in {column["name"] for column in inspect(conn).get_columns("jobs")}:  # v1 made before it
        conn.execute(text("ALTER TABLE jobs ADD COLUMN devices INTEGER NOT NULL DEFAULT 1"))


def _v3(conn: Connection) -> None:
    """The workers registry, Idempotency-Key answers, and jobs.model_deleted_at (a deleted fine-tuned model)."""
    workers.create(conn, checkfirst=True)
    idempotency_keys.create(conn, checkfirst=True)
    if "model_deleted_at" not in {column["name"] for column in inspect(conn).get_columns("jobs")}:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN model_deleted_at BIGINT"))


USAGE_COLUMNS = {
    "started_at": "BIGINT",
    "estimate_billed_tokens": "BIGINT",
    "estimate_device_seconds": "DOUBLE PRECISION",
    "device_seconds": "DOUBLE PRECISION",
    "price_per_million_tokens": "DOUBLE PRECISION",
    "gpu_hour_price": "DOUBLE PRECISION",
}


def _v4(conn: Connection) -> None:
    """A job's usage: when its trainer started, its estimate, its device time and the prices it was planned at."""
    have = {column["name"] for column in inspect(conn).get_columns("jobs")}
    for name, kind in USAGE_COLUMNS.items():
        if name not in have:  # a v1 made with today's table has them already
            conn.execute(text(f"ALTER TABLE jobs ADD COLUMN {name} {kind}"))


AUDIT_APPEND_ONLY = {
    "sqlite": [
        f"CREATE TRIGGER IF NOT EXISTS audit_records_no_{verb.lower()} BEFORE {verb} ON audit_records "
        "BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END"
        for verb in ("UPDATE", "DELETE")
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION audit_records_append_only() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'audit records are append-only'; END $$",
        "DROP TRIGGER IF EXISTS audit_records_no_change ON audit_records",
        "CREATE TRIGGER audit_records_no_change BEFORE UPDATE OR DELETE ON audit_records "
        "FOR EACH ROW EXECUTE FUNCTION audit_records_append_only()",
    ],
}


def _v5(conn: Connection) -> None:
    """The audit trail, and triggers that refuse an UPDATE or DELETE of its rows (a hand edit must drop them first,
    and the hash chain still tells: audit_trail.py)."""
    audit_records.create(conn, checkfirst=True)
    for statement in AUDIT_APPEND_ONLY.get(conn.dialect.name, []):
        conn.exec_driver_sql(statement)


def _v6(conn: Connection) -> None:
    """A deleted job's tombstone: when it was deleted, and what was removed (DELETE /v1/fine_tuning/jobs/{id})."""
    have = {column["name"] for column in inspect(conn).get_columns("jobs")}
    for name, kind in (("deleted_at", "BIGINT"), ("removed", "JSON")):
        if name not in have:
            conn.execute(text(f"ALTER TABLE jobs ADD COLUMN {name} {kind}"))


def _v7(conn: Connection) -> None:
    """workers.waiting: what a worker's job waits for (a Ray cluster's devices), for /readyz."""
    if "waiting" not in {column["name"] for column in inspect(conn).get_columns("workers")}:
        conn.execute(text("ALTER TABLE workers ADD COLUMN waiting JSON"))


def _v8(conn: Connection) -> None:
    """Quotas per tenant, and the tokens a job not yet planned holds against its tenant's monthly quota."""
    tenant_quotas.create(conn, checkfirst=True)
    job_token_holds.create(conn, checkfirst=True)


def _v9(conn: Connection) -> None:
    """Evaluations of succeeded jobs, started through the API or the dashboard and run by a worker."""
    evaluations.create(conn, checkfirst=True)


def _v10(conn: Connection) -> None:
    """jobs.general_data_file: a job's own general conversations for self-replay, an upload named by its id."""
    if "general_data_file" not in {column["name"] for column in inspect(conn).get_columns("jobs")}:
        conn.execute(text("ALTER TABLE jobs ADD COLUMN general_data_file VARCHAR(64)"))


MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [
    (1, _v1),
    (2, _v2),
    (3, _v3),
    (4, _v4),
    (5, _v5),
    (6, _v6),
    (7, _v7),
    (8, _v8),
    (9, _v9),
    (10, _v10),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _sqlite_setup(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (below), not the sqlite3 module
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

    return engine


def is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


@contextmanager
def transaction(engine: Engine, write: bool = False) -> Iterator[Connection]:
    """One transaction; `write` takes SQLite's write lock at BEGIN."""
    with engine.connect().execution_options(write=write) as conn, conn.begin():
        yield conn


def migrate(engine: Engine) -> int:
    """Bring the schema to SCHEMA_VERSION; returns the version found before."""
    with transaction(engine, write=True) as conn:
        if is_postgres(engine):
            conn.execute(text("SELECT pg_advisory_xact_lock(7254001)"))  # several workers starting at once
        schema_version.create(conn, checkfirst=True)
        found = conn.execute(schema_version.select()).scalar()
        if found is None:
            conn.execute(schema_version.insert().values(version=0))
            found = 0
        for version, step in MIGRATIONS:
            if version > found:
                step(conn)
                conn.execute(schema_version.update().values(version=version))
        return found
