"""Everything the service keeps of one tenant's, found (`tenant_removals`) and removed (`purge_tenant`): what
`finetune serve purge` does (cli/purge.py prints it).

    its keys revoked first (nothing new arrives), its jobs that have not ended cancelled (their workers stop them),
    then on disk: uploads, run folders (checkpoints, weights), plans, trainers' logs, token cache entries
    (deletion.py); in the database: files, jobs, events, checkpoints, Idempotency-Key answers. Its keys' rows stay,
    revoked: their ids are what an audit trail names.
"""

from __future__ import annotations

import contextlib
import time

from finetune.service.options import ServiceOptions
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
    sha256_of,
)
from finetune.service.storage.store import IllegalTransition, Store
from finetune.settings.errors import UserError


def tenant_removals(options: ServiceOptions, store: Store, tenant: str) -> list[Removal]:
    """Every path the service keeps of the tenant's, with its bytes (each once)."""
    items: list[Removal] = []
    digests: set[str] = set()
    for row in tombstones.tenant_files(store.engine, tenant):
        upload = options.files_dir / row["id"]
        digests |= {d for d in [sha256_of(upload)] if d}
        items += found("upload" if row["purpose"] != "fine-tune-results" else "results file", upload, options=options)
    for job in tombstones.tenant_jobs(store.engine, tenant):
        digests |= job_digests(options, job["id"])
        items += job_removals(options, job, with_cache=False)
    items += cache_entries(cache_roots(options), digests)
    return list({item.path: item for item in items}.values())  # a results file is the job's and the tenant's


def purge_tenant(
    options: ServiceOptions, store: Store, tenant: str, running: list[dict], wait_s: float
) -> tuple[list[Removal], dict[str, int]]:
    """Revoke the tenant's keys, cancel its `running` jobs, wait for their workers, then remove everything of it;
    (what was removed, the rows deleted by table)."""
    tombstones.revoke_tenant_keys(store.engine, tenant)  # first: nothing new arrives while the rest goes
    for job in running:
        with contextlib.suppress(IllegalTransition):  # it ended meanwhile
            store.transition(tenant, job["id"], "cancel")
    tombstones.fail_waiting_evaluations(store.engine, tenant, "its tenant is being purged")  # running ones end soon
    _wait_for_workers(store, tenant, wait_s)
    items = tenant_removals(options, store, tenant)  # now: a stopping trainer wrote its last checkpoint
    remove(items)
    counts = tombstones.delete_tenant_rows(store.engine, tenant)
    AuditLog(store.engine).append("tenant.purge", tenant=tenant, object_id=tenant)  # the trail itself stays
    return items, counts


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
