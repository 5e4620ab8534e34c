"""`finetune serve`, `finetune worker`, `finetune keys`: what cli.py's cmd_* functions call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime

from finetune.service.options import ServiceSettings
from finetune.service.storage.audit_trail import AuditLog
from finetune.service.storage.keys import key_id_of
from finetune.service.storage.store import Store
from finetune.settings.errors import UserError

DATABASE_ENV = "FINETUNE_DATABASE_URL"  # how `serve` hands the URL to its workers: never on a command line


def settings_from(args) -> ServiceSettings:
    from finetune.service.options import parse_models

    values = {"data_dir": args.data_dir, "database": args.database or os.environ.get(DATABASE_ENV) or None}
    names = ("lease_seconds", "heartbeat_seconds", "max_upload_bytes", "price_per_million_tokens", "max_models")
    for name in (*names, "gpu_hour_price", "metrics_token", "retain_days"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    if getattr(args, "devices", None) is not None:
        values["worker_devices"] = args.devices
    values["models"] = parse_models(getattr(args, "model", None))
    return ServiceSettings(**values)


def _open_store(settings: ServiceSettings) -> Store:
    settings.make_dirs()
    try:
        store = Store(settings.database_url)
        store.migrate()
    except Exception as exc:  # a wrong URL or an unreachable server: say which, without the password
        from sqlalchemy.engine import make_url

        shown = make_url(settings.database_url).render_as_string(hide_password=True)
        raise UserError(f"cannot open the database {shown}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return store


def run_serve(args, worker_entry: list[str] | None = None) -> int:
    """`worker_entry`: how a worker process starts (default: this Python's `-m finetune`; tests pass their own)."""
    import uvicorn

    from finetune.service.api.app import create_app
    from finetune.service.logs import setup_logging, uvicorn_options
    from finetune.service.workers.supervise import Supervisor

    setup_logging(args.log_format, "serve")  # --log-format json: every line from here on is a JSON object
    settings = settings_from(args)
    if not settings.models:
        print("note: no --model NAME=PATH given: jobs can name no base model until one is registered", file=sys.stderr)
    store = _open_store(settings)
    key = store.ensure_default_key()
    if key:
        _audit_key(store, "key.create", "default", key_id_of(key))
        print(f"created an API key for tenant 'default' (shown only this once): {key}", flush=True)
    entry = worker_entry or [sys.executable, "-m", "finetune"]
    workers = Supervisor(lambda: _start_worker(args, settings, entry), args.workers)  # restarted when one dies
    workers.start()
    try:
        app = create_app(settings, store)
        print(
            f"serving the fine-tuning API on http://{args.host}:{args.port}/v1 ({args.workers} worker(s))", flush=True
        )
        uvicorn.run(app, host=args.host, port=args.port, **uvicorn_options(args.log_format))
    finally:
        workers.stop()  # each checkpoints its job and queues it again
        store.close()
    return 0


def _start_worker(args, settings: ServiceSettings, entry: list[str]) -> subprocess.Popen:
    command = [*entry, "worker", "--data-dir", str(settings.data_dir)]
    for name in ("lease_seconds", "heartbeat_seconds", "price_per_million_tokens", "gpu_hour_price", "log_format",
                 "retain_days"):  # fmt: skip
        if getattr(args, name, None) is not None:  # its workers plan at serve's prices and log as serve does
            command += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    env = dict(os.environ)
    if settings.database:
        env[DATABASE_ENV] = settings.database
    from functools import partial

    from finetune.train.launchers import die_with_parent

    # a worker dies with a killed `serve` (SIGKILL: a stopped one gets SIGTERM from it, and checkpoints), and its
    # trainer with it: the job's lease runs out and another worker resumes it from its last checkpoint
    return subprocess.Popen(command, env=env, preexec_fn=partial(die_with_parent, signal.SIGKILL, os.getpid()))


def run_worker_command(args, launcher=None) -> int:
    """`launcher`: where the trainer runs (default: `--launcher`'s; tests pass a local one running a stand-in)."""
    from finetune.service.logs import setup_logging
    from finetune.service.workers.worker import Worker
    from finetune.train.launchers import launcher_for

    setup_logging(args.log_format, "worker")
    settings = settings_from(args)
    launcher = launcher or launcher_for(args.launcher, args.ray_address, args.placement_timeout)
    if launcher.name == "ray":  # the ranks run elsewhere: the plan's paths must mean the same on every node
        settings.data_dir = settings.data_dir.resolve()
    store = _open_store(settings)
    worker = Worker(settings, store, launcher=launcher)

    def stop(_signum, _frame) -> None:
        worker.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    takes = f"jobs on up to {worker.max_devices} device(s)" if worker.max_devices else "jobs on any number of devices"
    if launcher.name == "ray":
        takes += f" of the Ray cluster at {getattr(launcher, 'address', '?')}, as it is now"
    print(f"worker {worker.name} ready (data in {settings.data_dir}; takes {takes})", flush=True)
    worker.run_forever()
    store.close()
    return 0


def run_keys(args) -> int:
    store = _open_store(settings_from(args))
    try:
        if args.keys_command == "create":
            key_id, key = store.create_key(args.tenant)
            _audit_key(store, "key.create", args.tenant, key_id)
            print(f"API key {key_id} for tenant {args.tenant!r} (shown only this once; only its hash is stored):")
            print(key)
        elif args.keys_command == "list":
            print(f"{'id':<14} {'tenant':<24} {'created (UTC)':<20} revoked")
            for row in store.list_keys():
                revoked = _when(row["revoked_at"]) if row["revoked_at"] else "-"
                print(f"{row['id']:<14} {row['tenant']:<24} {_when(row['created_at']):<20} {revoked}")
        else:
            # the id from `keys list`, or the whole key pasted in (never echoed back: only its id is shown)
            key_id = key_id_of(args.key_id) or args.key_id
            tenant = next((row["tenant"] for row in store.list_keys() if row["id"] == key_id), None)
            if not store.revoke_key(key_id):
                _audit_key(store, "key.revoke", tenant, key_id if tenant else None, "refused")
                raise UserError(f"no active key with id {key_id!r} (see `finetune keys list`)")
            _audit_key(store, "key.revoke", tenant, key_id)
            print(f"revoked key {key_id}")
    finally:
        store.close()
    return 0


def _audit_key(store: Store, action: str, tenant: str | None, key_id: str | None, outcome: str = "ok") -> None:
    """The audit trail's record of a key made or revoked on the command line (audit.py)."""
    AuditLog(store.engine).append(action, tenant=tenant, key_id=key_id, object_id=key_id, outcome=outcome)


def _when(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")
