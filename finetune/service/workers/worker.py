"""A worker: claim a job, validate and plan it, run `finetune train` on it through its launcher (a child process,
or ranks on a Ray cluster: train/launchers.py), and turn the run folder into events and checkpoints, renewing the
lease all the while.

    queued -> claim (lease + token) -> validating_files -> queued (planned) -> running -> succeeded | failed
                                                     cancel / pause: SIGTERM -> the trainer checkpoints and stops
Every status it writes is an event of the one table of transitions (store.TRANSITIONS).

Every write carries the claim token, so a worker that lost its lease (stalled past it, and another worker took
the job) has its writes refused and kills its trainer. A worker killed outright leaves the job `running` with
a lease that runs out; the next worker to claim it counts a death at the last checkpoint's step and resumes
from that checkpoint (`--resume`), which reproduces an uninterrupted run's weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from finetune.service.api.objects import fine_tuned_model_name, method_type
from finetune.service.logs import bind_job, log_job_events
from finetune.service.options import ServiceSettings
from finetune.service.storage import usage
from finetune.service.storage.store import Claim, LeaseLost, Store, new_id, now
from finetune.service.workers import library as core
from finetune.service.workers.events import (
    checkpoint_metrics,
    diagnosis_event,
    metrics_event,
    results_csv,
    trainer_error,
)
from finetune.service.workers.presence import WorkerPresence
from finetune.service.workers.retention import RetentionSweeper
from finetune.settings.errors import ERROR_FILE_ENV, UserError
from finetune.settings.wording import AUDIENCE_ENV, render
from finetune.train.launchers import Launcher, LocalLauncher, TrainerRun
from finetune.train.speed import speed_key, speeds_measured_here, torch_device


class Worker:
    _clock: usage.DeviceClock | None = None  # the device time of the attempt running now

    def __init__(
        self,
        settings: ServiceSettings,
        store: Store,
        name: str | None = None,
        poll_seconds: float = 1.0,
        launcher: Launcher | None = None,
    ):
        self.settings = settings
        self.store = store
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.poll_seconds = poll_seconds
        self.stopping = threading.Event()
        self.waiting: dict | None = None  # what its job's trainer waits for now (a Ray cluster's devices): /readyz
        # where the trainer runs: a child process here (`--launcher local`), or ranks on a Ray cluster
        self.launcher = launcher or LocalLauncher()
        self.device_kind = self.launcher.device_kind()

    @property
    def max_devices(self) -> int | None:
        """The most devices a job this worker takes may ask for: `--devices`, else what its launcher has now (this
        machine's GPUs, none on a CPU-only one; a Ray cluster's GPUs, or its CPUs)."""
        return self.settings.worker_devices or self.launcher.devices()

    # ------------------------------------------------------------------ the loop

    def run_forever(self) -> None:
        # in the workers registry (presence.py) while it runs: /healthz counts it, plans read its device
        presence = WorkerPresence(
            self.store, self.name, self.settings, self.max_devices, self.device_kind, self.stopping,
            speeds_measured_here(torch_device()), waiting=lambda: self.waiting,
        )  # fmt: skip
        presence.start()
        if self.settings.retain_days is not None:  # --retain-days: old data deleted hourly (retention.py)
            RetentionSweeper(self.settings, self.store, self.stopping).start()
        try:
            while not self.stopping.is_set():
                try:
                    busy = self.run_once()
                except Exception as exc:  # the database is unreachable for a while: keep trying, quietly
                    print(f"worker {self.name}: cannot claim jobs: {type(exc).__name__}", file=sys.stderr)
                    busy = False
                if not busy:
                    self.stopping.wait(self.poll_seconds)
        finally:
            presence.stop()

    def run_once(self) -> bool:
        claim = self.store.claim(self.name, self.settings.lease_seconds, self.max_devices)
        if claim is None:
            return False
        keeper = LeaseKeeper(self.store, claim.job["id"], claim.token, self.settings)
        keeper.start()  # from the claim on: validation and planning can take longer than a lease
        bind_job(claim.job)  # --log-format json: its lines carry the job's id and tenant
        try:
            self._process(claim, keeper)
        except LeaseLost:
            print(f"worker {self.name}: lost the lease on {claim.job['id']}; another worker has it", file=sys.stderr)
        except Exception:  # a bug must not take the worker down, nor send the job round every worker forever
            traceback.print_exc()
            with contextlib.suppress(Exception):
                self._fail(claim.job, claim.token, "internal_error", "the worker failed unexpectedly; see its log")
        finally:
            keeper.stop()
            bind_job(None)
        return True

    # ------------------------------------------------------------------ one job

    def _process(self, claim: Claim, keeper: LeaseKeeper) -> None:
        job, token = claim.job, claim.token
        run = self.settings.runs_dir / job["id"]
        if claim.was_running and not self._count_death(job, token, run, "its worker stopped answering"):
            return
        # a job paused or resumed before it was planned has not been validated either
        unchecked = job["resolved"] is None
        if unchecked and not self._validate(job, token):
            return
        plan_path = self.settings.runs_dir / f"{job['id']}.plan.json"
        needs_plan = job["resolved"] is None or not plan_path.exists()
        if needs_plan and not self._plan(job, token, run, plan_path):
            return
        # the trainer ran before (it wrote plan.json): continue, from its newest checkpoint or from step 0
        resume = (run / "plan.json").exists()
        attempts = job["attempts"] + 1
        first_start = {"started_at": now()} if job.get("started_at") is None else {}  # usage: the queue wait ends
        started = self._update(
            job["id"],
            token,
            "start",
            {"attempts": attempts, **first_start},
            [{"message": f"Resuming from step {(core.checkpoint_steps(run) or [0])[-1]} (attempt {attempts})"}]
            if resume
            else [{"message": f"Fine-tuning job started (attempt {attempts})"}],
        )
        if not started:  # paused or cancelled meanwhile
            self.store.release(job["id"], token)
            return
        job.update(first_start)
        self._clock = usage.DeviceClock(job.get("device_seconds"), job["devices"])  # usage: this attempt's time
        self._train(job, token, run, plan_path, resume, attempts, keeper)

    def _update(self, job_id: str, token: str, event=None, values=None, new_events=None) -> bool:
        """store.worker_update, renewing the lease with the write; its events are log lines too (logs.py)."""
        lease = self.settings.lease_seconds
        done = self.store.worker_update(job_id, token, event, values, new_events, lease_seconds=lease)
        if done:
            log_job_events(job_id, new_events)
        return done

    def _fail(self, job: dict, token: str, code: str, message: str, param: str | None = None) -> None:
        self._update(
            job["id"],
            token,
            "fail",
            {"finished_at": now(), "error": {"code": code, "message": message, "param": param}},
            [{"message": f"Fine-tuning job failed: {message}", "level": "error"}],
        )
        self.store.release(job["id"], token)

    def _count_death(self, job: dict, token: str, run: Path, why: str, ended: str = "The trainer died") -> bool:
        """A trainer died mid-run (or its launcher ended the attempt: `ended`). False when that has now happened too
        often at the same step (the job failed)."""
        steps = core.checkpoint_steps(run)
        step = steps[-1] if steps else 0
        deaths = job["deaths_at_step"] + 1 if job["death_step"] == step else 1
        if deaths >= self.settings.max_deaths_at_step:
            message = f"{ended.lower()} {deaths} times at step {step} ({why}); not retrying"
            self._fail(job, token, "training_died", message)
            return False
        counted = self._update(
            job["id"],
            token,
            "died",
            {"death_step": step, "deaths_at_step": deaths},
            [
                {
                    "message": f"{ended} at step {step} ({why}); resuming from its last checkpoint",
                    "level": "warn",
                }
            ],  # fmt: skip
        )
        if not counted:  # cancelled or paused meanwhile
            self.store.release(job["id"], token)
            return False
        job.update(death_step=step, deaths_at_step=deaths, status="running")
        return True

    def _files(self, job: dict) -> tuple[Path, Path | None]:
        files = self.settings.files_dir
        return files / job["training_file"], files / job["validation_file"] if job["validation_file"] else None

    def _config(self, job: dict, run: Path):
        data, val = self._files(job)
        settings = dict(job["run_settings"], cache_dir=str(self.settings.token_cache_dir))  # deletion.py finds it
        if job["lr_multiplier"] and "lr_multiplier" not in settings:  # a job created before it was a setting
            settings["lr_multiplier"] = job["lr_multiplier"]
        return core.run_config(
            settings, str(data), job["model_location"], job["seed"], str(val) if val else None, str(run)
        )

    def _validate(self, job: dict, token: str) -> bool:
        config = self._config(job, self.settings.runs_dir / job["id"])
        data, val = self._files(job)
        checks = [(data, job["training_file"], "training_file")]
        notes: list[dict] = []  # sensitive values found in a usable file: events (core.validate_training_file)
        if val:
            checks.append((val, job["validation_file"], "validation_file"))
        for path, file_id, param in checks:
            shown = self._shown_name(job["tenant"], file_id)
            if not path.is_file():
                self._fail(job, token, f"invalid_{param}", f"{shown}: the file was deleted", param)
                return False
            error = core.validate_training_file(path, shown, config, param, notes)
            if error:
                self._fail(job, token, error["code"], error["message"], error["param"])
                return False
        events = [{"message": "Validated training file(s)"}, *notes]
        validated = self._update(job["id"], token, "validated", new_events=events)
        if not validated:  # cancelled or paused meanwhile
            self.store.release(job["id"], token)
            return False
        job["status"] = "queued"
        return True

    def _uploaded_names(self, job: dict) -> dict[Path, str]:
        data, val = self._files(job)
        names = {data: self._shown_name(job["tenant"], job["training_file"])}
        return names | ({val: self._shown_name(job["tenant"], job["validation_file"])} if val else {})

    def _shown_name(self, tenant: str, file_id: str) -> str:
        row = self.store.get_file(tenant, file_id)
        return row["filename"] if row else file_id

    def _plan(self, job: dict, token: str, run: Path, plan_path: Path) -> bool:
        """Plan the job, once: the test set held out into its run folder, the data prepared, the plan written for the
        trainer to execute. Its warnings become events, in the caller's terms."""
        # estimates for this machine, costed at this worker's prices (usage.py)
        config = dataclasses.replace(self._config(job, run), gpu=self.device_kind, **usage.prices_of(self.settings))
        try:
            plan = core.plan_job(config, out=run).plan
        except UserError as exc:  # the data as tokenized and split, or the settings, cannot train
            data, val = self._files(job)
            shown_val = self._shown_name(job["tenant"], job["validation_file"]) if val else None
            shown = self._shown_name(job["tenant"], job["training_file"])
            error = core.planning_error(exc, config, data, shown, val, shown_val)
            self._fail(job, token, error["code"], error["message"], error["param"])
            return False
        kind = method_type(job)
        core.write_plan(plan, plan_path, kind)
        if plan.cost.tokens_per_s:  # measured here while planning: the API's next plans use it (service/pool.py)
            seq_len = plan.data.max_record_tokens or plan.max_seq_len
            key = speed_key(plan.run.model, plan.method, seq_len)
            self.store.workers.record_speed(self.name, key, plan.cost.tokens_per_s)
        resolved = core.resolved_hyperparameters(plan, kind)
        summary = (
            f"Planned {plan.total_steps} steps: {plan.epochs} epoch(s) of {plan.data.examples} examples, "
            f"batch {plan.effective_batch}, learning rate {plan.learning_rate:.3g}, {plan.tokens_processed} tokens"
        )
        numbers = ("total_steps", "epochs", "effective_batch", "tokens_processed")
        data = {name: getattr(plan, name) for name in numbers} | {"examples": plan.data.examples}
        planned = usage.planned_values(plan)  # usage: the estimate, and the prices the job is costed at
        data["usage"] = usage.job_usage({**job, **planned})
        new_events = [{"message": summary, "data": data}]
        uploaded = self._uploaded_names(job)  # lines named as the caller uploaded the file, not `file-<id>:N`
        warned = [f"[{w['code']}] {render(w['template'], 'api', kind)}" for w in plan.warnings]
        new_events += [{"message": core.as_uploaded(message, uploaded), "level": "warn"} for message in warned]
        seconds = plan.cost.seconds
        values = {"resolved": resolved, "estimated_finish": now() + int(seconds) if seconds else None, **planned}
        self._update(job["id"], token, "planned", values, new_events)
        job.update(resolved=resolved, **planned)
        return True

    # ------------------------------------------------------------------ training

    def _train(
        self, job: dict, token: str, run: Path, plan_path: Path, resume: bool, attempt: int, keeper: LeaseKeeper
    ) -> None:
        log_path = self.settings.logs_dir / f"{job['id']}-attempt-{attempt}.log"
        error_path = log_path.with_suffix(".error.json")
        # its files, errors and messages in the API caller's terms (wording.py)
        env = {ERROR_FILE_ENV: str(error_path), AUDIENCE_ENV: f"api:{method_type(job)}"}
        started = time.monotonic()  # after the job's start was written: a status read before is not a cancel
        trainer = self.launcher.start(TrainerRun(plan_path, run, resume, log=log_path, env=env))
        stop_sent = False
        try:
            while (code := trainer.wait(timeout=self.settings.heartbeat_seconds)) is None:
                if keeper.lost:
                    raise LeaseLost(job["id"])
                status = keeper.status_since(started)
                if (status not in (None, "running") or self.stopping.is_set()) and not stop_sent:
                    trainer.stop()  # every process saves a checkpoint at the step boundary
                    stop_sent = True
                self._tell_waiting(job, token, getattr(trainer, "waiting", None))
                self._sync(job, token, run)
        except BaseException:  # the lease lost, or this worker failing: no trainer may write on
            trainer.kill()
            raise
        finally:
            self.waiting = None
        self._sync(job, token, run)
        self._finish(job, token, run, code, stop_sent, log_path, getattr(trainer, "failure", None))

    def _tell_waiting(self, job: dict, token: str, waiting: str | None) -> None:
        """The trainer waits for resources (a Ray cluster's devices): an event when that starts, and /readyz says so
        while it lasts (through this worker's heartbeat)."""
        if not waiting:
            self.waiting = None
            return
        if self.waiting is None:  # "progress": after a cancel or a pause, their event stays the last word
            self._update(job["id"], token, "progress", new_events=[{"message": waiting, "level": "warn"}])
            self.waiting = {"job": job["id"], "since": now()}
        self.waiting = {**self.waiting, "message": waiting}  # one assignment: the heartbeat thread reads it

    def _finish(
        self, job: dict, token: str, run: Path, code: int, stop_sent: bool, log_path: Path, failure: str | None
    ) -> None:
        if self._clock is not None:  # usage: this attempt's device time, however it ended
            spent, self._clock = self._clock.values(), None
            job.update(spent)
            self._update(job["id"], token, values=spent)
        status = self.store.heartbeat(job["id"], token, self.settings.lease_seconds)
        if code == 0 and core.read_report(run) is not None:
            if status == "running":
                self._succeed(job, token, run)
            self.store.release(job["id"], token)
            return
        if stop_sent:
            if status == "running":  # this worker was told to stop: another one resumes the job
                self._update(
                    job["id"], token, "requeue", new_events=[{"message": "Worker stopping; the job is queued again"}]
                )
            self.store.release(job["id"], token)
            return
        if code == 1:  # the library's own error for something in the data or settings
            data, _ = self._files(job)
            shown = self._shown_name(job["tenant"], job["training_file"])
            message = core.scrub(trainer_error(log_path, method_type(job)), data, shown)
            self._fail(job, token, "training_failed", message)
            return
        job.update(self.store.get_job_any(job["id"]) or {})
        why = f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
        ended = "The attempt ended" if failure else "The trainer died"  # its launcher's reason: never placed
        if self._count_death(job, token, run, failure or why, ended):
            self._update(job["id"], token, "requeue")
            self.store.release(job["id"], token)

    def _succeed(self, job: dict, token: str, run: Path) -> None:
        report = core.read_report(run) or {}
        rows = core.read_metrics(run)
        file_id = new_id("file")
        content = results_csv(rows).encode()
        (self.settings.files_dir / file_id).write_bytes(content)
        self.store.add_file(job["tenant"], file_id, "step_metrics.csv", "fine-tune-results", len(content))
        name = fine_tuned_model_name(job)
        new_events = [e for e in [diagnosis_event(report)] if e]
        ended = {**job, "status": "succeeded", "trained_tokens": report.get("tokens_processed")}
        new_events.append({"message": "The job has successfully completed", "data": {"usage": usage.job_usage(ended)}})
        done = self._update(
            job["id"],
            token,
            "succeed",
            {
                "finished_at": now(),
                "fine_tuned_model": name,
                "trained_tokens": report.get("tokens_processed"),
                "result_files": [file_id],
                "report": _jsonable(report),
            },
            new_events,
        )
        if not done:
            self.store.delete_file(job["tenant"], file_id)
            (self.settings.files_dir / file_id).unlink(missing_ok=True)

    # ------------------------------------------------------------------ run folder -> events, checkpoints

    def _sync(self, job: dict, token: str, run: Path) -> None:
        plan = core.read_plan(run) or {}
        rows = core.read_metrics(run)
        total = plan.get("total_steps")
        save_every = plan.get("save_every") or 0
        fresh = [r for r in rows if r["step"] > job["events_step"]]
        new_events = []
        for row in fresh:
            evaluated = row.get("val_loss") is not None
            saved = (save_every and row["step"] % save_every == 0) or row["step"] == total
            if evaluated or saved:
                new_events.append(metrics_event(row, total))
        if fresh:
            last = fresh[-1]["step"]
            # after a cancel or pause the terminal or paused event stays the last word
            values = {"events_step": last, **(self._clock.values() if self._clock else {})}  # usage: time so far
            if self._update(job["id"], token, "progress", values, new_events):
                job["events_step"] = last
        by_step = {r["step"]: r for r in rows}
        kept = {step: checkpoint_metrics(by_step.get(step, {"step": step})) for step in core.checkpoint_steps(run)}
        self.store.sync_checkpoints(job["id"], token, kept, fine_tuned_model_name(job))


class LeaseKeeper(threading.Thread):
    """Renews a claimed job's lease every heartbeat for as long as this worker holds it, and notes the job's
    status (a cancel or pause shows up here) or that the lease went to another worker."""

    def __init__(self, store: Store, job_id: str, token: str, settings: ServiceSettings) -> None:
        super().__init__(name=f"lease-{job_id}", daemon=True)
        self.store, self.job_id, self.token, self.settings = store, job_id, token, settings
        self.seen: tuple[float, str | None] = (0.0, None)  # (when the last beat began, the status it read)
        self.lost = False
        self._done = threading.Event()

    def status_since(self, t: float) -> str | None:
        """The job's status as read by a beat that began after `t` (time.monotonic; None: none has yet): a beat
        that read `queued` just before the worker wrote the job's start must not read as a cancel or a pause."""
        began, status = self.seen
        return status if began > t else None

    def run(self) -> None:
        while not self._done.wait(self.settings.heartbeat_seconds):
            try:
                began = time.monotonic()
                self.seen = (began, self.store.heartbeat(self.job_id, self.token, self.settings.lease_seconds))
            except LeaseLost:
                self.lost = True
                return
            except Exception as exc:  # a database hiccup: the lease still has time; try again next beat
                print(f"heartbeat for {self.job_id} failed: {type(exc).__name__}", file=sys.stderr)

    def stop(self) -> None:
        self._done.set()
        self.join()


def _jsonable(report: dict) -> dict:
    return json.loads(json.dumps(report, default=str))
