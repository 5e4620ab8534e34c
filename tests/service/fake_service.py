"""Test-only entry point: `finetune serve` and `finetune worker` whose workers run the stand-in trainer
(fake_trainer.py) instead of `finetune train`, so tests push many jobs through claim, lease, run and complete
in seconds. Product code has no test hook: the worker takes its launcher as an argument, and `serve` the command its
workers start with; this file passes its own.

    python tests/service/fake_service.py worker --data-dir D [...]      # as `finetune worker`
    python tests/service/fake_service.py serve --port P [...]           # as `finetune serve`; its workers are these
"""

from __future__ import annotations

import sys
from pathlib import Path

FAKE_TRAINER = Path(__file__).resolve().with_name("fake_trainer.py")


def fake_launcher():
    """A local launcher whose trainer is fake_trainer.py (it gets `finetune train`'s arguments)."""
    from finetune.train.launchers import LocalLauncher

    return LocalLauncher(program=[sys.executable, str(FAKE_TRAINER)])


def main(argv: list[str]) -> int:
    from finetune.commands.cli import build_parser
    from finetune.service.cli.serve import run_serve
    from finetune.service.cli.worker import run_worker_command

    args = build_parser().parse_args(argv)
    if args.command == "worker":
        return run_worker_command(args, launcher=fake_launcher())
    if args.command == "serve":
        return run_serve(args, worker_entry=[sys.executable, str(Path(__file__).resolve())])
    raise SystemExit("fake_service.py runs `serve` or `worker` only")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
