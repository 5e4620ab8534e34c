"""The command-line flags of pricing, metrics and logging for `finetune serve` and `finetune worker`, and the
`finetune usage` command's parser: cli.py calls these (one line each) so its own list stays short."""

from __future__ import annotations

import argparse

from finetune.service.logs import LOG_FORMATS


def price_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--price-per-million-tokens",
        type=float,
        default=None,
        metavar="X",
        help="what a million billed tokens cost (a job's usage and GET /v1/usage; costed when planned)",
    )
    p.add_argument("--gpu-hour-price", type=float, default=None, metavar="X",
                   help="what a device-hour costs (a job's usage and GET /v1/usage; costed when planned)")  # fmt: skip


def log_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="text (default) or json: one JSON object per line, for log shippers")  # fmt: skip


def serve_flags(p: argparse.ArgumentParser) -> None:
    price_flags(p)
    log_flag(p)
    p.add_argument("--metrics-token", default=None, metavar="TOKEN",
                   help="GET /metrics needs 'Authorization: Bearer TOKEN', and names tenants only then "
                        "(default: open, every tenant summed as tenant=\"*\"; keep it off the internet)")  # fmt: skip
    retention_flag(p)  # passed on to its workers, which sweep


def worker_flags(p: argparse.ArgumentParser) -> None:
    price_flags(p)
    log_flag(p)
    retention_flag(p)


def retention_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retain-days", type=float, default=None, metavar="N",
                   help="delete ended jobs' data and unused files older than N days, hourly (default: keep them)")  # fmt: skip


def usage_parser(sub, store_flags) -> None:
    p = sub.add_parser("usage", help="billed tokens, device time and cost per tenant and model (the operator's view)")
    store_flags(p)
    p.add_argument("--tenant", default=None, help="one tenant (default: every tenant)")
    p.add_argument("--since", default=None, metavar="DATE",
                   help="jobs created on or after DATE (2025-01-31, an ISO time, or unix seconds; default: all)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_usage)


def _cmd_usage(args: argparse.Namespace) -> int:
    from finetune.service.cli.usage import run_usage  # sqlalchemy: the database, only when the command runs

    return run_usage(args)
