"""What every service command does first with its flags: the service's options (`options_from`), and its
database opened with them (`open_store`, migrated to the current schema)."""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

from finetune.service.options import ServiceOptions, parse_models
from finetune.service.storage.store import Store
from finetune.settings.errors import UserError

DATABASE_ENV = "FINETUNE_DATABASE_URL"  # how `serve` hands the URL to its workers: never on a command line


def options_from(args) -> ServiceOptions:
    values = {"data_dir": args.data_dir, "database": args.database or os.environ.get(DATABASE_ENV) or None}
    names = ("lease_seconds", "heartbeat_seconds", "max_upload_bytes", "price_per_million_tokens", "max_models")
    for name in (*names, "gpu_hour_price", "metrics_token", "retain_days", "storage"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    if getattr(args, "devices", None) is not None:
        values["worker_devices"] = args.devices
    values["models"] = parse_models(getattr(args, "model", None))
    return ServiceOptions(**values)


def open_store(options: ServiceOptions) -> Store:
    options.make_dirs()
    try:
        store = Store(options.database_url)
        store.migrate()
    except Exception as exc:  # a wrong URL or an unreachable server: say which, without the password
        shown = make_url(options.database_url).render_as_string(hide_password=True)
        raise UserError(f"cannot open the database {shown}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return store
