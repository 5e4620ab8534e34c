"""The parser of `finetune serve tenants set|unset|list` (the operator's quotas per tenant, quotas.py); registered in
parser.ADMIN_COMMANDS. What the commands run is in tenants.py."""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Callable

from finetune.service.tenant_names import DEFAULT_TENANT, RULE, tenant_name

FLAGS = {  # quota -> what its flag sets
    "max_running_jobs": "jobs a worker holds at once; past it the tenant's jobs wait queued while others' run",
    "max_queued_jobs": "jobs waiting for a worker; a create past it is 429 with Retry-After",
    "max_stored_bytes": "bytes of its files (uploads, results files); an upload past it is 403",
    "max_monthly_tokens": "billed tokens of the jobs created in a UTC calendar month; a create past it is 403",
}
# the most each can be: what its database column keeps (jobs: an INTEGER, bytes and tokens: a BIGINT)
MOST = {"max_running_jobs": 2**31 - 1, "max_queued_jobs": 2**31 - 1, "max_stored_bytes": 2**63 - 1,
        "max_monthly_tokens": 2**63 - 1}  # fmt: skip
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def amount(text: str, most: int = 2**63 - 1) -> int | None:
    """A whole number of at least 0 with an optional unit (1500, 2k, 5M, 10GiB, 512MB) up to `most`, or `none` (no
    own value)."""
    if text.strip().lower() == "none":
        return None
    found = re.fullmatch(r"\s*(\d+)\s*(k|m|g|t|ki|mi|gi|ti)?b?\s*", text, flags=re.IGNORECASE)
    if not found:
        raise argparse.ArgumentTypeError(f"expected a whole number (e.g. 3, 5M, 10GiB) or none, got {text!r}")
    value = int(found.group(1)) * _UNITS[(found.group(2) or "").lower()]
    if value > most:
        raise argparse.ArgumentTypeError(f"at most {most}, or none for no quota at all; got {text!r}")
    return value


def quota_tenant(text: str) -> str:
    """A tenant's name as `tenants set` takes it: a name a tenant may have (tenant_names.py), or * (the default)."""
    return text if text == DEFAULT_TENANT else tenant_name(text)


def add_tenants_parser(admin, store_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    p = admin.add_parser("tenants", help="quotas per tenant: set, unset, list (docs/service.md, Quotas)")
    commands = p.add_subparsers(dest="tenants_command", required=True)
    what = "a tenant's name, or * for the default of every tenant without its own value"
    s = commands.add_parser("set", help="set a tenant's quotas (the others stay); `none` removes one")
    s.add_argument("tenant", metavar="NAME", type=quota_tenant, help=f"{what} ({RULE})")
    for name, text in FLAGS.items():
        most = functools.partial(amount, most=MOST[name])
        s.add_argument("--" + name.replace("_", "-"), type=most, default=argparse.SUPPRESS, metavar="N", help=text)
    u = commands.add_parser("unset", help="remove a tenant's own quotas (the named ones; all without a flag)")
    u.add_argument("tenant", metavar="NAME", help=what)
    for name in FLAGS:
        u.add_argument("--" + name.replace("_", "-"), action="store_true", default=argparse.SUPPRESS)
    ls = commands.add_parser("list", help="every tenant's quotas beside what it uses now")
    ls.add_argument("--json", action="store_true", help="print one JSON object")
    for command in (s, u, ls):
        store_flags(command)
        command.set_defaults(func=_cmd_tenants)


def _cmd_tenants(args: argparse.Namespace) -> int:
    from finetune.service.cli.tenants import run_tenants  # sqlalchemy: the database, only when a command runs

    return run_tenants(args)
