"""`finetune serve audit [--since DATE] [--tenant T]`: the operator's export of the audit trail, one JSON line per
record, oldest first, each exactly as stored with its hash (storage/audit_trail.py says how to check one by hand); `--verify`
checks the whole chain instead and exits 1 naming the first bad record."""

from __future__ import annotations

import argparse
import json
import re
import sys

from finetune.settings.errors import UserError

NOTED = re.compile(r"^(\d+):([0-9a-f]{64})$")


def add_audit_parser(sub, store_flags) -> None:
    p = sub.add_parser("audit", help="export the audit trail as JSON lines, or check its hash chain (--verify)")
    store_flags(p)
    p.add_argument("--since", default=None, metavar="DATE",
                   help="records made on or after DATE (2025-01-31, an ISO time, or unix seconds; default: all)")  # fmt: skip
    p.add_argument("--tenant", default=None, help="one tenant's records (default: every record)")
    p.add_argument("--verify", action="store_true",
                   help="check the whole hash chain: exit 0 and print its head, or exit 1 naming the first bad record")  # fmt: skip
    p.add_argument("--noted", default=None, metavar="SEQ:HASH",
                   help="with --verify: a head printed by an earlier --verify and kept elsewhere; it must still hold")  # fmt: skip
    p.set_defaults(func=run_audit)


def run_audit(args: argparse.Namespace) -> int:
    # sqlalchemy: the database's modules, only when the command runs (every command line builds this parser)
    from finetune.service.cli.from_flags import open_store, options_from  # sqlalchemy
    from finetune.service.storage.audit_trail import AuditLog  # sqlalchemy
    from finetune.service.storage.usage import parse_time  # sqlalchemy

    if args.verify and (args.since or args.tenant):
        raise UserError("--verify checks the whole chain: it takes no --since or --tenant")
    noted = None
    if args.noted is not None:
        found = NOTED.match(args.noted.strip())
        if not args.verify or not found:
            raise UserError(f"--noted takes SEQ:HASH as --verify prints it (with --verify), got {args.noted!r}")
        noted = (int(found.group(1)), found.group(2))
    try:
        since = parse_time(args.since, "--since")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    store = open_store(options_from(args))
    try:
        log = AuditLog(store.engine)
        if not args.verify:
            for record in log.records(since, args.tenant):
                print(json.dumps(record, ensure_ascii=False, sort_keys=True))
            return 0
        verdict = log.verify(noted)
    finally:
        store.close()
    if not verdict.ok:
        print(f"audit trail broken at record {verdict.bad_seq}: {verdict.problem}", file=sys.stderr)
        print(f"(records 1-{verdict.records} hold)" if verdict.records else "(no record before it holds)",
              file=sys.stderr)  # fmt: skip
        return 1
    if verdict.head_seq is None:
        print("audit trail intact: no records yet")
    else:
        print(f"audit trail intact: {verdict.records} records; head {verdict.head_seq}:{verdict.head_hash}")
        print("(keep the head elsewhere; `--verify --noted SEQ:HASH` later shows the trail was not cut or rewritten)")
    return 0
