"""`--log-format text|json` for `finetune serve` and `finetune worker`.

text (the default) leaves the output as it always was. json makes every line the process writes on stdout and
stderr one JSON object, for log shippers:

    {"timestamp": "2025-01-31T12:00:00.123Z", "level": "info", "event": "job_event", "message": "...",
     "process": "worker", "job_id": "ftjob-...", "tenant": "acme", ...}

Python's logging goes through one formatter: uvicorn's access log (with the request's route template, tenant and
job id, which the HTTP middleware notes: api/prometheus.py), the job events a worker writes, and anything else logged.
Whatever is printed (a warning, a traceback, a library's message) becomes an `output` event, one per line.
`job_id` and `tenant` are those of the job a worker is working on, or of the request.
"""

from __future__ import annotations

import contextvars
import io
import json
import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Any

LOG_FORMATS = ("text", "json")
EVENTS = logging.getLogger("finetune.service.jobs")  # a job's events as a worker writes them
EVENTS.addHandler(logging.NullHandler())  # text mode: the events are the API's, not lines on the terminal

# the job a worker works on now (it takes one at a time; its lease keeper's thread logs for it too)
_job: dict[str, str] = {}
# the request whose response starts now: uvicorn's access log line is written inside the middleware's send
request_fields: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("request_fields", default=None)
FIELDS = ("job_id", "tenant", "type", "data", "stream", "method", "route", "path", "status", "client")


def bind_job(job: dict | None) -> None:
    """The job this process now works on (None: none): its lines carry its id and tenant."""
    _job.clear()
    if job is not None:
        _job.update(job_id=job["id"], tenant=job["tenant"])


def log_job_events(job_id: str, new_events: list[dict] | None) -> None:
    """The events a worker wrote, as log records (only JSON mode shows them; the tenant is the bound job's)."""
    for event in new_events or []:
        level = {"warn": logging.WARNING, "error": logging.ERROR}.get(event.get("level", "info"), logging.INFO)
        extra = {"event": "job_event", "job_id": job_id, "type": event.get("type", "message")}
        if event.get("data") is not None:
            extra["data"] = event["data"]
        EVENTS.log(level, event["message"], extra=extra)


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
            "level": record.levelname.lower(),
            "event": getattr(record, "event", None) or _event_name(record),
            "message": record.getMessage(),
            "process": self.process,
        }
        entry |= _job
        if record.name == "uvicorn.access" and request_fields.get():
            entry |= {k: v for k, v in request_fields.get().items() if v is not None}
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def _event_name(record: logging.LogRecord) -> str:
    return {"uvicorn.access": "http_request", "uvicorn.error": "server"}.get(record.name, record.name)


class _LinesToLog(io.TextIOBase):
    """sys.stdout / sys.stderr in json mode: each line written becomes one `output` record."""

    def __init__(self, logger: logging.Logger, level: int, stream: str) -> None:
        super().__init__()
        self._logger, self._level, self._stream = logger, level, stream
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._pending + text).split("\n")
            self._pending = lines.pop()
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            line, self._pending = self._pending, ""
        self._emit(line)

    def _emit(self, line: str) -> None:
        line = line.rstrip("\r")
        if line.strip():
            self._logger.log(self._level, line, extra={"event": "output", "stream": self._stream})

    @property
    def encoding(self) -> str:
        return "utf-8"


def setup_logging(log_format: str, process: str) -> None:
    """Text: nothing changes. JSON: one handler on the root logger writing to the real stdout, warnings logged,
    and sys.stdout / sys.stderr turned into line-by-line records."""
    if log_format != "json":
        return
    handler = logging.StreamHandler(sys.__stdout__)
    handler.setFormatter(JsonFormatter(process))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    output = logging.getLogger("finetune.output")
    sys.stdout = _LinesToLog(output, logging.INFO, "stdout")
    sys.stderr = _LinesToLog(output, logging.WARNING, "stderr")


def uvicorn_options(log_format: str) -> dict[str, Any]:
    """uvicorn.run's logging options: its own configuration in text mode; in json mode its loggers propagate to
    the root logger's JSON handler (log_config None: uvicorn configures nothing)."""
    return {"log_level": "info"} if log_format != "json" else {"log_level": "info", "log_config": None}
