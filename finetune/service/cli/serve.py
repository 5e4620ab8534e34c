"""`finetune serve`: the API (with its dashboard) on HOST:PORT, and `--workers N` worker processes it starts,
restarts when one dies, and stops (each checkpoints its job) when it stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from functools import partial

import uvicorn

from finetune.service.cli.from_flags import DATABASE_ENV, open_store, options_from
from finetune.service.cli.keys import audit_key
from finetune.service.dashboard.app import create_app
from finetune.service.logs import setup_logging, uvicorn_options
from finetune.service.options import ServiceOptions
from finetune.service.storage.keys import key_id_of
from finetune.service.workers.supervise import Supervisor
from finetune.train.trainer_run import die_with_parent


def run_serve(args, worker_entry: list[str] | None = None) -> int:
    """`worker_entry`: how a worker process starts (default: this Python's `-m finetune`; tests pass their own)."""
    setup_logging(args.log_format, "serve")  # --log-format json: every line from here on is a JSON object
    options = options_from(args)
    if not options.models:
        print("note: no --model NAME=PATH given: jobs can name no base model until one is registered", file=sys.stderr)
    store = open_store(options)
    key = store.ensure_default_key()
    if key:
        audit_key(store, "key.create", "default", key_id_of(key))
        print(f"created an API key for tenant 'default' (shown only this once): {key}", flush=True)
    entry = worker_entry or [sys.executable, "-m", "finetune"]
    workers = Supervisor(lambda: _start_worker(args, options, entry), args.workers)  # restarted when one dies
    workers.start()
    try:
        app = create_app(options, store)
        print(
            f"serving the fine-tuning API on http://{args.host}:{args.port}/v1 ({args.workers} worker(s))", flush=True
        )
        uvicorn.run(app, host=args.host, port=args.port, **uvicorn_options(args.log_format))
    finally:
        workers.stop()  # each checkpoints its job and queues it again
        store.close()
    return 0


def _start_worker(args, options: ServiceOptions, entry: list[str]) -> subprocess.Popen:
    command = [*entry, "worker", "--data-dir", str(options.data_dir)]
    for name in ("lease_seconds", "heartbeat_seconds", "price_per_million_tokens", "gpu_hour_price", "log_format",
                 "retain_days", "storage"):  # fmt: skip
        if getattr(args, name, None) is not None:  # its workers plan at serve's prices and log as serve does
            command += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    env = dict(os.environ)
    if options.database:
        env[DATABASE_ENV] = options.database
    # a worker dies with a killed `serve` (SIGKILL: a stopped one gets SIGTERM from it, and checkpoints), and its
    # trainer with it: the job's lease runs out and another worker resumes it from its last checkpoint
    return subprocess.Popen(command, env=env, preexec_fn=partial(die_with_parent, signal.SIGKILL, os.getpid()))
