"""`finetune keys create|list|revoke`: the operator's API keys (storage/keys.py makes and hashes them); each key
made or revoked is a record of the audit trail."""

from __future__ import annotations

from datetime import UTC, datetime

from finetune.service.cli.from_flags import open_store, options_from
from finetune.service.storage.audit_trail import AuditLog
from finetune.service.storage.keys import key_id_of
from finetune.service.storage.store import Store
from finetune.settings.errors import UserError


def run_keys(args) -> int:
    store = open_store(options_from(args))
    try:
        if args.keys_command == "create":
            key_id, key = store.create_key(args.tenant)
            audit_key(store, "key.create", args.tenant, key_id)
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
                audit_key(store, "key.revoke", tenant, key_id if tenant else None, "refused")
                raise UserError(f"no active key with id {key_id!r} (see `finetune keys list`)")
            audit_key(store, "key.revoke", tenant, key_id)
            print(f"revoked key {key_id}")
    finally:
        store.close()
    return 0


def audit_key(store: Store, action: str, tenant: str | None, key_id: str | None, outcome: str = "ok") -> None:
    """The audit trail's record of a key made or revoked on the command line (audit_trail.py)."""
    AuditLog(store.engine).append(action, tenant=tenant, key_id=key_id, object_id=key_id, outcome=outcome)


def _when(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")
