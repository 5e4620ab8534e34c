"""ServiceOptions: how one service runs (its data folder, database, registered models, prices, leases, quotas of
memory and devices), from the flags of `finetune serve`, `worker`, `keys` and the admin commands. Not a run's
settings (RunConfig, settings/): those are a job's, from its hyperparameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from finetune.bucket.uri import check_location, is_remote
from finetune.models.source import local_model
from finetune.settings.errors import UserError

DEFAULT_DATA_DIR = "./finetune-data"
DEFAULT_MAX_UPLOAD_BYTES = 512 * 1024 * 1024


MAX_RETAIN_DAYS = 36_500  # past it the sweep's cutoff is nothing a time can be (inf made it fail every hour)


@dataclass
class ServiceOptions:
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    database: str | None = None
    """SQLAlchemy URL; None = SQLite (WAL) at DATA_DIR/finetune.db."""
    models: dict[str, str] = field(default_factory=dict)
    """Base models jobs may name: NAME -> local folder or hub id (nothing else is ever loaded)."""
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    price_per_million_tokens: float | None = None
    """What a million billed tokens cost a tenant (a job's usage, GET /v1/usage); None = no price."""
    gpu_hour_price: float | None = None
    """What a device-hour costs a tenant (a job's usage, GET /v1/usage); None = no price."""
    metrics_token: str | None = None
    """GET /metrics needs `Authorization: Bearer <this>`; None = /metrics is open, its tenants summed as `*`."""
    lease_seconds: float = 30.0
    """A worker that has not renewed its lease for this long is presumed dead; its job goes to another."""
    heartbeat_seconds: float = 2.0
    max_deaths_at_step: int = 3
    """A job whose trainer dies this many times at the same step fails instead of resuming again."""
    max_models: int = 4
    """Models (a base, or an adapter on it) that chat completions keep in memory; the least recently used goes."""
    worker_devices: int | None = None
    """A worker takes only jobs that train on at most this many devices; None = this machine's GPUs (any on a CPU)."""
    retain_days: float | None = None
    """Ended jobs' data and unused files older than this many days are deleted (retention.py); None = kept."""
    storage: str | None = None
    """s3://bucket/prefix: where the service keeps its files and runs, the data folder a copy on each machine
    (storage/bucket_copy.py); None = the data folder alone."""

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.max_models < 1:
            raise UserError(f"--max-models must be at least 1, got {self.max_models}")
        if self.worker_devices is not None and self.worker_devices < 1:
            raise UserError(f"--devices must be at least 1, got {self.worker_devices}")
        if self.retain_days is not None and not 0 < self.retain_days <= MAX_RETAIN_DAYS:  # inf, nan too
            raise UserError(
                f"--retain-days must be a number of days above 0 and at most {MAX_RETAIN_DAYS} (100 years; leave it "
                f"out to keep everything), got {self.retain_days}"
            )
        if self.storage is not None:
            check_location(self.storage, "--storage")
            if not is_remote(self.storage):
                raise UserError(f"--storage takes a bucket URI (s3://bucket/prefix), got {self.storage!r}")
            self.storage = self.storage.rstrip("/")
        for flag, price in (("--price-per-million-tokens", self.price_per_million_tokens),
                            ("--gpu-hour-price", self.gpu_hour_price)):  # fmt: skip
            if price is not None and not price >= 0:
                raise UserError(f"{flag} must be a number of at least 0, got {price}")

    @property
    def database_url(self) -> str:
        return self.database or f"sqlite:///{(self.data_dir / 'finetune.db').resolve()}"

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    @property
    def uploads_dir(self) -> Path:
        """Uploads in progress: a file only moves to files/ once complete, then its row is committed."""
        return self.data_dir / "uploads"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def token_cache_dir(self) -> Path:
        """The jobs' token cache: inside the data folder, so that deleting a file finds its entries (deletion.py)."""
        return (self.data_dir / "cache" / "tokens").resolve()

    def make_dirs(self) -> None:
        for folder in (self.data_dir, self.files_dir, self.uploads_dir, self.runs_dir, self.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)


def parse_models(pairs: list[str] | None) -> dict[str, str]:
    """`--model NAME=PATH_OR_HUB_ID` (repeatable) -> {NAME: location}; a GGUF file or a pulled base's name
    becomes its converted folder."""
    models: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, location = pair.partition("=")
        if not sep or not name.strip() or not location.strip():
            raise UserError(f"--model expects NAME=PATH_OR_HUB_ID, got {pair!r}")
        models[name.strip()] = local_model(location.strip())  # a GGUF file is converted once, here, at start
    return models
