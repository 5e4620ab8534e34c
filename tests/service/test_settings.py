"""`finetune serve` and `worker` flags reach the service: --max-models sizes the chat-completions engine, a
worker's --devices bounds the jobs it takes."""

from __future__ import annotations

import pytest

from finetune.commands.cli import build_parser
from finetune.service.cli.from_flags import options_from
from finetune.service.dashboard.app import create_app
from finetune.settings.errors import UserError


def test_max_models_reaches_the_engine(tmp_path):
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--max-models", "2"])
    app = create_app(options_from(args))
    assert app.state.engine.max_models == 2


def test_max_models_defaults_to_four_and_refuses_zero(tmp_path):
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path)])
    assert options_from(args).max_models == 4
    with pytest.raises(UserError, match="--max-models must be at least 1"):
        options_from(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--max-models", "0"]))


def test_worker_devices_reach_the_worker(tmp_path):
    from finetune.service.storage.store import Store
    from finetune.service.workers.worker import Worker

    store = Store(f"sqlite:///{tmp_path / 'w.db'}")
    store.migrate()
    args = build_parser().parse_args(["worker", "--data-dir", str(tmp_path), "--devices", "2"])
    assert Worker(options_from(args), store).max_devices == 2
    default = options_from(build_parser().parse_args(["worker", "--data-dir", str(tmp_path)]))
    assert Worker(default, store).max_devices is None  # this CPU-only machine: no limit (gloo processes)
    with pytest.raises(UserError, match="--devices must be at least 1"):
        options_from(build_parser().parse_args(["worker", "--data-dir", str(tmp_path), "--devices", "0"]))
    store.close()


def test_prices_and_the_metrics_token_reach_serve_and_its_workers(tmp_path):
    from finetune.service.cli.serve import _start_worker

    flags = ["--price-per-million-tokens", "2.5", "--gpu-hour-price", "3", "--log-format", "json"]
    args = build_parser().parse_args(["serve", "--data-dir", str(tmp_path), "--metrics-token", "t0k", *flags])
    settings = options_from(args)
    assert (settings.price_per_million_tokens, settings.gpu_hour_price, settings.metrics_token) == (2.5, 3.0, "t0k")
    worker = build_parser().parse_args(["worker", "--data-dir", str(tmp_path), *flags])
    assert (options_from(worker).price_per_million_tokens, options_from(worker).gpu_hour_price) == (2.5, 3.0)
    started = _start_worker(args, settings, ["true"])  # the command serve starts a worker with (`true`: exits)
    started.wait()
    command = started.args
    assert command[command.index("--gpu-hour-price") + 1] == "3.0" and "t0k" not in command  # the token stays
    assert command[command.index("--log-format") + 1] == "json"
    with pytest.raises(UserError, match="--gpu-hour-price must be a number of at least 0"):
        options_from(build_parser().parse_args(["worker", "--data-dir", str(tmp_path), "--gpu-hour-price", "-1"]))
