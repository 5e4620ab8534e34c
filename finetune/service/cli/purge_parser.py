"""The parser of `finetune serve purge --tenant NAME [--dry-run]` (registered in parser.ADMIN_COMMANDS; what it runs
is in purge.py): the operator removes everything of one tenant.

    its keys revoked first (nothing new arrives), its jobs that have not ended cancelled (their workers stop them),
    then on disk: uploads, run folders (checkpoints, weights), plans, trainers' logs, token cache entries
    (deletion.py); in the database: files, jobs, events, checkpoints, Idempotency-Key answers. Its keys' rows stay,
    revoked: their ids are what an audit trail names.

`--dry-run` lists what would go (each path and its bytes, the rows, the keys, the jobs to cancel) and changes nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

DEFAULT_WAIT_S = 120.0


def add_purge_parser(sub, store_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "purge", help="remove everything of one tenant: files, jobs' folders, caches, models; its keys revoked"
    )
    p.add_argument("--tenant", required=True, help="the tenant whose data goes")
    p.add_argument("--dry-run", action="store_true", help="list what would go (paths and bytes); remove nothing")
    p.add_argument("--wait-seconds", type=float, default=DEFAULT_WAIT_S, metavar="S",
                   help=f"how long to wait for workers to stop the tenant's running jobs (default {DEFAULT_WAIT_S:g})")  # fmt: skip
    store_flags(p)
    p.set_defaults(func=cmd_purge)


def cmd_purge(args: argparse.Namespace) -> int:
    from finetune.service.cli.purge import run_purge  # sqlalchemy: the database, only when the command runs

    return run_purge(args)
