"""The names a tenant may have (docs/service.md, "Tenants"): 1 to 64 ASCII letters, digits, '.', '_' and '-',
beginning with a letter or a digit (`acme`, `team-7.eu`). A name is typed in shells, shown by the dashboard, the
audit trail and `finetune usage`, and is a label of /metrics: nothing in it needs quoting or escaping anywhere.
`*` is not a tenant: `finetune serve tenants set '*'` sets the default of every tenant."""

from __future__ import annotations

import argparse
import re

DEFAULT_TENANT = "*"  # the quotas of every tenant without its own (quotas.py)
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RULE = "1-64 letters, digits, '.', '_' or '-', beginning with a letter or a digit"


def tenant_name(text: str) -> str:
    """An argparse type: a new tenant's name, as it may be (`keys create --tenant`, `tenants set NAME`)."""
    if not TENANT_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"a tenant's name is {RULE}; got {text!r}")
    return text
