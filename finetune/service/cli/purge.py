"""What `finetune serve purge --tenant NAME [--dry-run]` runs (purge_parser.py holds its parser): it says what the
tenant has, then removes everything of it (storage/tenant_purge.py), or with `--dry-run` lists what would go (each
path and its bytes, the keys, the jobs to cancel) and changes nothing."""

from __future__ import annotations

from finetune.service.cli.from_flags import open_store, options_from
from finetune.service.options import ServiceOptions
from finetune.service.storage import tombstones
from finetune.service.storage.deletion import Removal
from finetune.service.storage.store import TERMINAL, Store
from finetune.service.storage.tenant_purge import purge_tenant, tenant_removals
from finetune.settings.errors import UserError


def run_purge(args) -> int:
    options = options_from(args)
    store = open_store(options)
    try:
        return _purge(options, store, args.tenant, args.dry_run, args.wait_seconds)
    finally:
        store.close()


def _purge(options: ServiceOptions, store: Store, tenant: str, dry_run: bool, wait_s: float) -> int:
    keys = tombstones.tenant_keys(store.engine, tenant)
    jobs = tombstones.tenant_jobs(store.engine, tenant)
    files = tombstones.tenant_files(store.engine, tenant)
    if not (keys or jobs or files):
        raise UserError(f"tenant {tenant!r} has no key, file or job here (data folder {options.data_dir})")
    running = [job for job in jobs if job["status"] not in TERMINAL]
    verb = "would" if dry_run else "will"
    print(f"tenant {tenant!r}: {len(files)} file(s), {len(jobs)} job(s), {len(keys)} active key(s)")
    for key in keys:
        print(f"  {verb} revoke key {key['id']}")
    for job in running:
        print(f"  {verb} cancel job {job['id']} ({job['status']})")
    if dry_run:
        _print_items(tenant_removals(options, store, tenant), "would remove")
        print("dry run: nothing was changed")
        return 0
    items, counts = purge_tenant(options, store, tenant, running, wait_s)
    _print_items(items, "removed")
    print("deleted rows: " + ", ".join(f"{count} {what}" for what, count in counts.items()))
    print(f"revoked {len(keys)} key(s); tenant {tenant!r} is purged")
    return 0


def _print_items(items: list[Removal], verb: str) -> None:
    for item in items:
        print(f"  {verb} {item.bytes:>12,} bytes  {item.what:<18} {item.path}")
    print(f"  {verb} {sum(item.bytes for item in items):,} bytes in {len(items)} path(s) in all")
