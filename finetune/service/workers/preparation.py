"""A claimed job validated and planned, once, before its trainer starts (Worker.run_once calls `prepare`).

    its files screened   what needs no tokenizer: they read, their sensitive values (library.screen_training_file;
                         its own general conversations, general_data: library.screen_general_data)
    its plan made        the test set held out, the data prepared (tokenized once, into the token cache its
                         trainer reads), the plan written to RUNS/<job>.plan.json for `finetune train --plan`
    validated, planned   the job's events, in the caller's terms; a file the preparation refused is validated in
                         full then, so that its error names every problem (library.validate_training_file)

The job's RunConfig is built once, here, for this worker's device and prices; the API built one only to check the
hyperparameters. Nothing here loads torch; planning with the job's run folder is the run's start, so the base answers
self-replay's prompts then (its estimate and a line per batch become the job's events). The speed is what this
machine's runs left in its cache.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from finetune.plan.plan import Plan
from finetune.service.options import ServiceOptions
from finetune.service.storage import bucket_copy, usage
from finetune.service.storage.job_names import method_type
from finetune.service.storage.store import Store, now
from finetune.service.workers import library as core
from finetune.service.workers.bucket_jobs import published
from finetune.settings.config import RunConfig
from finetune.settings.errors import DataError, UserError
from finetune.settings.registry import setting
from finetune.settings.wording import render
from finetune.ship.eval.progress import PROGRESS


@contextmanager
def _progress_as_events(post: Callable[[dict], object]) -> Iterator[None]:
    """While a job is planned in this thread, the library's progress lines (the base's estimate before it answers
    self-replay's prompts, then a line per batch: ship/eval/replay.py) become the job's events; each also renews the
    claim's lease, so minutes of generation do not let the job go."""
    thread = threading.get_ident()

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            data = getattr(record, PROGRESS, None)
            if data is not None and record.thread == thread:
                post({"message": record.getMessage(), "data": data})

    handler, logger = Forward(logging.INFO), logging.getLogger("finetune")
    logger.addHandler(handler)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def job_files(options: ServiceOptions, job: dict) -> tuple[Path, Path | None]:
    """The stored uploads a job trains on: its training file, and its validation file (None: none)."""
    files = options.files_dir
    return files / job["training_file"], files / job["validation_file"] if job["validation_file"] else None


def named_files(job: dict) -> dict[str, str]:
    """The uploads a job's hyperparameters name by id (general_data), kept in their columns: setting -> file id."""
    columns = {spec.name: core.file_column(spec.name) for spec in core.file_settings()}
    return {name: job[column] for name, column in columns.items() if job.get(column)}


def shown_name(store: Store, tenant: str, file_id: str) -> str:
    """A file as its caller uploaded it (support.jsonl), never the stored upload's name."""
    row = store.get_file(tenant, file_id)
    return row["filename"] if row else file_id


@dataclass
class JobPreparation:
    store: Store
    options: ServiceOptions
    worker: str  # the worker's name in the registry
    device_kind: str | None  # what the plan sizes memory and time for
    update: Callable[..., bool]  # Worker._update: a write that carries the claim token and renews the lease
    fail: Callable[..., None]  # Worker._fail

    def prepare(self, job: dict, token: str, plan_path: Path) -> bool:
        """Validate and plan a claimed job, unless it was (a job paused or resumed before its plan was not validated
        either). False when the job failed, or was cancelled or paused meanwhile (let go of, then)."""
        if job["resolved"] is not None and plan_path.exists():
            return True
        for path, _, _ in self.all_files(job):  # --storage: uploads made on another machine come from the bucket
            bucket_copy.pull(self.options, path)
        config = self._config(job)  # the job's one RunConfig: validated and planned with, never rebuilt
        if job["resolved"] is None:
            notes = self._validate(job, token, config)
            return notes is not None and self._plan(job, token, config, plan_path, notes)
        return self._plan(job, token, config, plan_path)

    def _config(self, job: dict) -> RunConfig:
        """The job's run: its settings, the service's token cache (storage/deletion.py finds it), planned for this
        worker's device and costed at its prices (storage/usage.py)."""
        data, val = job_files(self.options, job)
        settings = dict(job["run_settings"], cache_dir=str(self.options.token_cache_dir), gpu=self.device_kind)
        settings |= usage.prices_of(self.options)
        settings |= {name: str(self.options.files_dir / file_id) for name, file_id in named_files(job).items()}
        if job["lr_multiplier"] and "lr_multiplier" not in settings:  # a job created before it was a setting
            settings["lr_multiplier"] = job["lr_multiplier"]
        run = self.options.runs_dir / job["id"]
        return core.run_config(
            settings, str(data), job["model_location"], job["seed"], str(val) if val else None, str(run)
        )

    def _checked_files(self, job: dict) -> list[tuple[Path, str, str]]:
        """(path, name as uploaded, param) of the job's training file and validation file."""
        data, val = job_files(self.options, job)
        checks = [(data, shown_name(self.store, job["tenant"], job["training_file"]), "training_file")]
        if val:
            checks.append((val, shown_name(self.store, job["tenant"], job["validation_file"]), "validation_file"))
        return checks

    def _named_files(self, job: dict) -> list[tuple[Path, str, str]]:
        """(path, name as uploaded, param) of the uploads its hyperparameters name (general_data)."""
        return [
            (self.options.files_dir / file_id, shown_name(self.store, job["tenant"], file_id),
             core.file_param(setting(name)))
            for name, file_id in named_files(job).items()
        ]  # fmt: skip

    def _validate(self, job: dict, token: str, config: RunConfig) -> list[dict] | None:
        """The checks of the job's files that need no tokenizer (core.screen_training_file, and for its general
        conversations core.screen_general_data); the others are the plan's preparation, which tokenizes them once.
        The events it has for a usable file (the sensitive values found), to be written once the plan has validated
        the rest; None when the job failed."""
        notes: list[dict] = []
        checks = [(core.screen_training_file, *checked) for checked in self._checked_files(job)]
        checks += [(core.screen_general_data, *checked) for checked in self._named_files(job)]
        for screen, path, shown, param in checks:
            if not path.is_file():
                self.fail(job, token, core.error_code(param), f"{shown}: the file was deleted", param)
                return None
            error = screen(path, shown, config, param, notes)
            if error:
                self.fail(job, token, error["code"], error["message"], error["param"])
                return None
        return notes

    def _explained(self, config: RunConfig, job: dict) -> dict | None:
        """The full validation's error for a file the plan's preparation refused (it names every problem), or None
        when the files validate: the plan's own error stands then."""
        for path, shown, param in self._checked_files(job):
            if error := core.validate_training_file(path, shown, config, param):
                return error
        return None

    def all_files(self, job: dict) -> list[tuple[Path, str, str]]:
        return self._checked_files(job) + self._named_files(job)

    def uploaded_names(self, job: dict) -> dict[Path, str]:
        """Each stored upload the job reads -> the name it was uploaded as (messages name the files so)."""
        return {path: shown for path, shown, _ in self.all_files(job)}

    def _plan(self, job: dict, token: str, config: RunConfig, plan_path: Path, notes: list[dict] | None = None) -> bool:
        """Plan the job, once: the test set held out into its run folder, the data prepared (tokenized, into the
        token cache), the plan written for the trainer to execute. Its warnings become events, in the caller's
        terms. `notes`: its files were just screened (_validate), and the preparation finishes their validation:
        the job is `validated` (with these events) once it did."""
        try:
            with _progress_as_events(lambda event: self.update(job["id"], token, new_events=[event])):
                plan = core.plan_job(config, out=Path(config.out)).plan  # the base answers replay's prompts here
        except UserError as exc:  # the data as tokenized and split, or the settings, cannot train
            explained = self._explained(config, job) if notes is not None and isinstance(exc, DataError) else None
            error = explained or self._planning_error(exc, config, job)
            self.fail(job, token, error["code"], error["message"], error["param"])
            return False
        if notes is not None and not self._validated(job, token, notes):
            return False
        kind = method_type(job)
        core.write_plan(plan, plan_path, kind)
        if bucket_copy.enabled(self.options):  # --storage: its trainer reads the plan and inputs from the bucket
            published(self.options, job["id"], plan, kind)
        self._remember_speed(plan)
        resolved = core.resolved_hyperparameters(plan, kind, named_files(job))
        seconds = plan.cost.seconds
        values = {"resolved": resolved, "estimated_finish": now() + int(seconds) if seconds else None}
        values |= usage.planned_values(plan)  # usage: the estimate, and the prices the job is costed at
        self.update(job["id"], token, "planned", values, self._plan_events(job, plan, values))
        job.update(values)
        return True

    def _validated(self, job: dict, token: str, notes: list[dict]) -> bool:
        events = [{"message": "Validated training file(s)"}, *notes]
        if not self.update(job["id"], token, "validated", new_events=events):  # cancelled or paused meanwhile
            self.store.release(job["id"], token)
            return False
        job["status"] = "queued"
        return True

    def _planning_error(self, exc: UserError, config: RunConfig, job: dict) -> dict:
        return core.planning_error(exc, config, self.all_files(job))

    def _remember_speed(self, plan: Plan) -> None:
        """The speed the plan was estimated with (this machine's runs' own, cached): the API's next plans use it."""
        if plan.cost.tokens_per_s:
            from finetune.train.speed import speed_key, speed_method  # torch: train/speed.py imports it

            seq_len = plan.data.max_record_tokens or plan.max_seq_len
            key = speed_key(plan.run.model, speed_method(plan.method, plan.dtype), seq_len)
            self.store.workers.record_speed(self.worker, key, plan.cost.tokens_per_s)

    def _plan_events(self, job: dict, plan: Plan, values: dict) -> list[dict]:
        """The plan's summary (with its numbers and the usage estimate), then its warnings, in the caller's terms."""
        summary = (
            f"Planned {plan.total_steps} steps: {plan.epochs} epoch(s) of {plan.data.examples} examples, "
            f"batch {plan.effective_batch}, learning rate {plan.learning_rate:.3g}, {plan.tokens_processed} tokens"
        )
        numbers = ("total_steps", "epochs", "effective_batch", "tokens_processed")
        data = {name: getattr(plan, name) for name in numbers} | {"examples": plan.data.examples}
        data["usage"] = usage.job_usage({**job, **values})
        uploaded = self.uploaded_names(job)  # lines named as the caller uploaded the file, not `file-<id>:N`
        warned = [f"[{w['code']}] {render(w['template'], 'api', method_type(job))}" for w in plan.warnings]
        return [{"message": summary, "data": data}] + [
            {"message": core.as_uploaded(message, uploaded), "level": "warn"} for message in warned
        ]
