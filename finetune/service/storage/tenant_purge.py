"""What `finetune serve purge` does (purge.py holds its command line): list, or remove, everything of one tenant."""

from __future__ import annotations

import contextlib
import time

from finetune.service.cli.serve import _open_store, settings_from
from finetune.service.options import ServiceSettings
from finetune.service.storage import tombstones
from finetune.service.storage.audit_trail import AuditLog
from finetune.service.storage.deletion import (
    Removal,
    cache_entries,
    cache_roots,
    found,
    job_digests,
    job_removals,
    remove,
)
from finetune.service.storage.deletion import sha256_of as _sha256
from finetune.service.storage.store import TERMINAL, IllegalTransition, Store
from finetune.settings.errors import UserError


def tenant_removals(settings: ServiceSettings, store: Store, tenant: str) -> list[Removal]:
    """Every path the service keeps of the tenant's, with its bytes (each once)."""
    items: list[Removal] = []
    digests: set[str] = set()
    for row in tombstones.tenant_files(store.engine, tenant):
        upload = settings.files_dir / row["id"]
        digests |= {d for d in [_sha256(upload)] if d}
        items += found("upload" if row["purpose"] != "fine-tune-results" else "results file", upload)
    for job in tombstones.tenant_jobs(store.engine, tenant):
        digests |= job_digests(settings, job["id"])
        items += job_removals(settings, job, with_cache=False)
    items += cache_entries(cache_roots(settings), digests)
    return list({item.path: item for item in items}.values())  # a results file is the job's and the tenant's


def run_purge(args) -> int:
    settings = settings_from(args)
    store = _open_store(settings)
    try:
        return _purge(settings, store, args.tenant, args.dry_run, args.wait_seconds)
    finally:
        store.close()


def _purge(settings: ServiceSettings, store: Store, tenant: str, dry_run: bool, wait_s: float) -> int:
    keys = tombstones.tenant_keys(store.engine, tenant)
    jobs = tombstones.tenant_jobs(store.engine, tenant)
    files = tombstones.tenant_files(store.engine, tenant)
    if not (keys or jobs or files):
        raise UserError(f"tenant {tenant!r} has no key, file or job here (data folder {settings.data_dir})")
    running = [job for job in jobs if job["status"] not in TERMINAL]
    verb = "would" if dry_run else "will"
    print(f"tenant {tenant!r}: {len(files)} file(s), {len(jobs)} job(s), {len(keys)} active key(s)")
    for key in keys:
        print(f"  {verb} revoke key {key['id']}")
    for job in running:
        print(f"  {verb} cancel job {job['id']} ({job['status']})")
    if dry_run:
        _print_items(tenant_removals(settings, store, tenant), "would remove")
        print("dry run: nothing was changed")
        return 0
    tombstones.revoke_tenant_keys(store.engine, tenant)  # first: nothing new arrives while the rest goes
    for job in running:
        with contextlib.suppress(IllegalTransition):  # it ended meanwhile
            store.transition(tenant, job["id"], "cancel")
    _wait_for_workers(store, tenant, wait_s)
    items = tenant_removals(settings, store, tenant)  # again: a stopping trainer wrote its last checkpoint
    remove(items)
    counts = tombstones.delete_tenant_rows(store.engine, tenant)
    AuditLog(store.engine).append("tenant.purge", tenant=tenant, object_id=tenant)  # the trail itself stays
    _print_items(items, "removed")
    print("deleted rows: " + ", ".join(f"{count} {what}" for what, count in counts.items()))
    print(f"revoked {len(keys)} key(s); tenant {tenant!r} is purged")
    return 0


def _wait_for_workers(store: Store, tenant: str, wait_s: float) -> None:
    """Until no worker holds a job of the tenant's (a cancelled trainer checkpoints, then its worker lets go)."""
    deadline = time.monotonic() + wait_s
    while held := tombstones.held_jobs(store.engine, tenant):
        if time.monotonic() >= deadline:
            named = ", ".join(f"{job['id']} (worker {job['worker']})" for job in held)
            raise UserError(
                f"workers still hold job(s) of tenant {tenant!r} after {wait_s:g} s: {named}; its keys are revoked "
                "and its jobs cancelled: run the purge again once they stopped"
            )
        time.sleep(0.5)


def _print_items(items: list[Removal], verb: str) -> None:
    for item in items:
        print(f"  {verb} {item.bytes:>12,} bytes  {item.what:<18} {item.path}")
    print(f"  {verb} {sum(item.bytes for item in items):,} bytes in {len(items)} path(s) in all")
