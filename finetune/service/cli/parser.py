"""The parsers of the job service's commands: `finetune serve` (and its admin commands), `finetune worker`,
`finetune keys`, `finetune usage`, and the launcher flags `train` shares with `worker`. What each runs is in its
own module here (serve.py, worker.py, keys.py, usage.py, ...), imported only when it runs: every `finetune` command
line builds these parsers, and only a service command needs the database, the web server or the worker."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from finetune.service.cli import flags as service_flags
from finetune.service.cli.audit import add_audit_parser
from finetune.service.cli.purge_parser import add_purge_parser
from finetune.service.cli.tenants_parser import add_tenants_parser
from finetune.service.tenant_names import RULE, tenant_name
from finetune.train.launchers import LAUNCHERS


def cmd_serve(args: argparse.Namespace) -> int:
    from finetune.service.cli.serve import run_serve  # fastapi, uvicorn, sqlalchemy: only when serving

    return run_serve(args)


def cmd_worker(args: argparse.Namespace) -> int:
    from finetune.service.cli.worker import run_worker_command  # sqlalchemy, torch (its devices): only a worker

    return run_worker_command(args)


def cmd_keys(args: argparse.Namespace) -> int:
    from finetune.service.cli.keys import run_keys  # sqlalchemy: only when the command runs

    return run_keys(args)


# `finetune serve <command>`: (name, a function adding its parser to the sub-parsers, given `store_flags`)
ADMIN_COMMANDS: list[tuple[str, Callable[[Any, Callable[[argparse.ArgumentParser], None]], None]]] = [
    ("audit", add_audit_parser),
    ("purge", add_purge_parser),
    ("tenants", add_tenants_parser),
]


def add_launcher_flags(p: argparse.ArgumentParser, what: str) -> None:
    """Where, not what, is trained: command options, not RunConfig settings."""
    p.add_argument("--launcher", choices=LAUNCHERS, default="local", help=f"where to {what}: local (this machine; the "
                   "default) or ray (ranks placed on a Ray cluster's nodes, docs/distributed.md)")  # fmt: skip
    p.add_argument("--ray-address", default=None, metavar="ADDR", help="with --launcher ray: the cluster's head, "
                   "HOST:6379, or auto on one of its nodes (default $RAY_ADDRESS)")  # fmt: skip
    p.add_argument("--placement-timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="with --launcher ray: how long a run's ranks may wait for the cluster's resources and start "
                   "before the attempt ends (default 300)")  # fmt: skip


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a number of seconds above 0, got {text!r}")
    return value


def add_service_parsers(sub) -> None:
    """serve / worker / keys / usage: the job service (finetune/service, docs/service.md)."""

    def store_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--data-dir", default="./finetune-data", help="database, uploads and runs (default ./finetune-data)"
        )
        p.add_argument(
            "--database", default=None, help="SQLAlchemy URL, e.g. postgresql://... (default SQLite in --data-dir)"
        )
        p.add_argument("--storage", default=None, metavar="s3://BUCKET/PREFIX",
                       help="keep uploads and runs in this bucket; --data-dir is then this machine's copy")  # fmt: skip

    def lease_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--lease-seconds", type=float, default=None, help="a silent worker loses its job after this (30)"
        )
        p.add_argument("--heartbeat-seconds", type=float, default=None, help="how often a worker renews its lease (2)")

    p = sub.add_parser("serve", help="the OpenAI-compatible fine-tuning API, with workers")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    store_flags(p)
    p.add_argument("--workers", type=int, default=1, help="worker processes to start (0 = API only)")
    p.add_argument("--model", action="append", default=[], metavar="NAME=PATH_OR_HUB_ID",
                   help="a base model jobs may name (repeatable)")  # fmt: skip
    p.add_argument("--max-upload-bytes", type=int, default=None, help="largest upload accepted (default 512 MiB)")
    p.add_argument(
        "--max-models", type=int, default=None, help="models chat completions keep in memory (default 4; LRU evicted)"
    )
    lease_flags(p)
    service_flags.serve_flags(p)
    p.set_defaults(func=cmd_serve)
    # the operator's commands on a service's data (`finetune serve purge|audit|tenants ...`); without one, serve
    admin = p.add_subparsers(dest="serve_command", metavar="{" + ",".join(name for name, _ in ADMIN_COMMANDS) + "}")
    for _, add_parser in ADMIN_COMMANDS:
        add_parser(admin, store_flags)

    p = sub.add_parser("worker", help="run a worker alone (another process or machine, same database)")
    store_flags(p)
    lease_flags(p)
    p.add_argument(
        "--devices", type=int, default=None, metavar="N",
        help="take only jobs that train on at most N devices (default: this machine's GPUs; any on a CPU-only one; "
        "with --launcher ray, the cluster's GPUs, or its CPUs)",
    )  # fmt: skip
    add_launcher_flags(p, "train each job")
    service_flags.worker_flags(p)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("keys", help="create, list and revoke API keys")
    keys = p.add_subparsers(dest="keys_command", required=True)
    for name, text in (("create", "print a new key once"), ("list", "list keys"), ("revoke", "revoke a key")):
        k = keys.add_parser(name, help=text)
        store_flags(k)
        if name == "create":
            k.add_argument("--tenant", required=True, type=tenant_name, help=f"the tenant the key acts for ({RULE})")
        if name == "revoke":
            k.add_argument("key_id", help="the key's id (from `finetune keys list`)")
    p.set_defaults(func=cmd_keys)
    service_flags.usage_parser(sub, store_flags)
