"""`finetune worker`: one worker process (workers/worker.py) on this machine, on the service's database: it takes
jobs until SIGTERM or SIGINT, then checkpoints the one it runs and lets it go."""

from __future__ import annotations

import signal

from finetune.service.cli.from_flags import open_store, options_from
from finetune.service.logs import setup_logging
from finetune.service.workers.worker import Worker
from finetune.train.launchers import launcher_for


def run_worker_command(args, launcher=None) -> int:
    """`launcher`: where the trainer runs (default: `--launcher`'s; tests pass a local one running a stand-in)."""
    setup_logging(args.log_format, "worker")
    options = options_from(args)
    launcher = launcher or launcher_for(args.launcher, args.ray_address, args.placement_timeout)
    if launcher.name == "ray":  # the ranks run elsewhere: the plan's paths must mean the same on every node
        options.data_dir = options.data_dir.resolve()
    store = open_store(options)
    worker = Worker(options, store, launcher=launcher)

    def stop(_signum, _frame) -> None:
        worker.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    takes = f"jobs on up to {worker.max_devices} device(s)" if worker.max_devices else "jobs on any number of devices"
    if launcher.name == "ray":
        takes += f" of the Ray cluster at {getattr(launcher, 'address', '?')}, as it is now"
    print(f"worker {worker.name} ready (data in {options.data_dir}; takes {takes})", flush=True)
    worker.run_forever()
    store.close()
    return 0
