"""A worker: claim a job, validate and plan it (preparation.py), run `finetune train` on it through its launcher (a
child process, or ranks on a Ray cluster: train/launchers.py), and turn the run folder into events and checkpoints,
renewing the lease all the while. It never trains in its own process: only its trainer needs torch. Between jobs it
runs the evaluations callers start (evaluation.py: `finetune eval RUN --retention` as a child process), first.

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
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from finetune.bucket.inputs import EPHEMERAL_ENV
from finetune.service.logs import bind_job, log_job_events
from finetune.service.options import ServiceOptions
from finetune.service.storage import bucket_copy, run_folders, usage
from finetune.service.storage.job_names import fine_tuned_model_name, method_type
from finetune.service.storage.store import TERMINAL, Claim, LeaseLost, Store, new_id, now
from finetune.service.workers import library as core
from finetune.service.workers.evaluation import EvaluationRunner
from finetune.service.workers.events import (
    checkpoint_metrics,
    diagnosis_event,
    metrics_event,
    results_csv,
    trainer_error,
)
from finetune.service.workers.preparation import JobPreparation
from finetune.service.workers.presence import WorkerPresence
from finetune.service.workers.retention import RetentionSweeper
from finetune.settings.errors import ERROR_FILE_ENV
from finetune.settings.wording import AUDIENCE_ENV
from finetune.train.launchers import LocalLauncher
from finetune.train.trainer_run import Launcher, TrainerRun


class Worker:
    _clock: usage.DeviceClock | None = None  # the device time of the attempt running now

    def __init__(
        self,
        options: ServiceOptions,
        store: Store,
        name: str | None = None,
        poll_seconds: float = 1.0,
        launcher: Launcher | None = None,
    ):
        self.options = options
        self.store = store
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.poll_seconds = poll_seconds
        self.stopping = threading.Event()
        self.waiting: dict | None = None  # what its job's trainer waits for now (a Ray cluster's devices): /readyz
        # where the trainer runs: a child process here (`--launcher local`), or ranks on a Ray cluster
        self.launcher = launcher or LocalLauncher()
        self.device_kind = self.launcher.device_kind()
        # validation and plan of a claimed job (preparation.py): its writes go through this worker's
        self.preparation = JobPreparation(store, options, self.name, self.device_kind, self._update, self._fail)
        # evaluations callers start (evaluation.py): `finetune eval` run by the program its trainers run (a stand-in's
        # in tests); on a Ray cluster's worker, on this machine
        program = getattr(self.launcher, "program", None)
        self.evaluations = EvaluationRunner(options, store, self.name, program, self.stopping)

    @property
    def max_devices(self) -> int | None:
        """The most devices a job this worker takes may ask for: `--devices`, else what its launcher has now (this
        machine's GPUs, none on a CPU-only one; a Ray cluster's GPUs, or its CPUs)."""
        return self.options.worker_devices or self.launcher.devices()

    # ------------------------------------------------------------------ the loop

    def run_forever(self) -> None:
        # torch: the speed cache is keyed by this machine's device (its runs' own speeds, remembered by trainers)
        from finetune.train.speed import speeds_measured_here, torch_device

        # in the workers registry (presence.py) while it runs: /healthz counts it, plans read its device
        presence = WorkerPresence(
            self.store, self.name, self.options, self.max_devices, self.device_kind, self.stopping,
            speeds_measured_here(torch_device()), waiting=lambda: self.waiting,
        )  # fmt: skip
        presence.start()
        if self.options.retain_days is not None:  # --retain-days: old data deleted hourly (retention.py)
            RetentionSweeper(self.options, self.store, self.stopping).start()
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
        if self.evaluations.run_once():  # a waiting evaluation first: minutes, bounded by its sets' sizes
            return True
        claim = self.store.claim(self.name, self.options.lease_seconds, self.max_devices)
        if claim is None:
            return False
        keeper = LeaseKeeper(self.store, claim.job["id"], claim.token, self.options)
        keeper.start()  # from the claim on: validation and planning can take longer than a lease
        bind_job(claim.job)  # --log-format json: its lines carry the job's id and tenant
        try:
            self._process(claim, keeper)
            self._let_go_if_ended(claim.job)
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
        run = bucket_copy.pull_run(self.options, job["id"])  # --storage: this machine's copy, from the bucket
        if claim.was_running and not self._count_death(job, token, run, "its worker stopped answering"):
            return
        plan_path = self.options.runs_dir / f"{job['id']}.plan.json"
        if not self.preparation.prepare(job, token, plan_path):
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
            [{"message": f"Resuming from step {(run_folders.checkpoint_steps(run) or [0])[-1]} (attempt {attempts})"}]
            if resume
            else [{"message": f"Fine-tuning job started (attempt {attempts})"}],
        )
        if not started:  # paused or cancelled meanwhile
            self.store.release(job["id"], token)
            return
        job.update(first_start)
        self._clock = usage.DeviceClock(job.get("device_seconds"), job["devices"])  # usage: this attempt's time
        self._train(job, token, run, plan_path, resume, attempts, keeper)

    def _let_go_if_ended(self, job: dict) -> None:
        """--storage: once the job has ended, this machine keeps no copy of its files (the bucket does)."""
        ended = self.store.get_job_any(job["id"]) or {}
        if bucket_copy.enabled(self.options) and ended.get("status") in TERMINAL:
            results = [self.options.files_dir / file_id for file_id in ended.get("result_files") or []]
            bucket_copy.let_go(self.options, job, [path for path, _, _ in self.preparation.all_files(job)] + results)

    def _update(self, job_id: str, token: str, event=None, values=None, new_events=None) -> bool:
        """store.worker_update, renewing the lease with the write; its events are log lines too (logs.py)."""
        lease = self.options.lease_seconds
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
        steps = run_folders.checkpoint_steps(run)
        step = steps[-1] if steps else 0
        deaths = job["deaths_at_step"] + 1 if job["death_step"] == step else 1
        if deaths >= self.options.max_deaths_at_step:
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

    # ------------------------------------------------------------------ training

    def _train(
        self, job: dict, token: str, run: Path, plan_path: Path, resume: bool, attempt: int, keeper: LeaseKeeper
    ) -> None:
        log_path = self.options.logs_dir / f"{job['id']}-attempt-{attempt}.log"
        error_path = log_path.with_suffix(".error.json")
        # its files, errors and messages in the API caller's terms (wording.py)
        env = {ERROR_FILE_ENV: str(error_path), AUDIENCE_ENV: f"api:{method_type(job)}"}
        env |= {EPHEMERAL_ENV: "1"} if bucket_copy.enabled(self.options) else {}  # no copy stays on the nodes
        started = time.monotonic()  # after the job's start was written: a status read before is not a cancel
        plan, out = (plan_path, run)
        if bucket_copy.enabled(self.options):  # --storage: the trainer reads its plan, and writes, in the bucket
            plan, out = bucket_copy.uri(self.options, plan_path), bucket_copy.uri(self.options, run)
        trainer = self.launcher.start(TrainerRun(plan, out, resume, log=log_path, env=env))
        stop_sent = False
        try:
            while (code := trainer.wait(timeout=self.options.heartbeat_seconds)) is None:
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
        status = self.store.heartbeat(job["id"], token, self.options.lease_seconds)
        if code == 0 and run_folders.read_report(run) is not None:
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
            uploaded = self.preparation.uploaded_names(job)  # its files as uploaded: no path on the server
            message = core.as_uploaded(trainer_error(log_path, method_type(job)), uploaded)
            self._fail(job, token, "training_failed", message)
            return
        job.update(self.store.get_job_any(job["id"]) or {})
        why = f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
        ended = "The attempt ended" if failure else "The trainer died"  # its launcher's reason: never placed
        if self._count_death(job, token, run, failure or why, ended):
            self._update(job["id"], token, "requeue")
            self.store.release(job["id"], token)

    def _succeed(self, job: dict, token: str, run: Path) -> None:
        report = run_folders.read_report(run) or {}
        rows = run_folders.read_metrics(run)
        file_id = new_id("file")
        content = results_csv(rows).encode()
        (self.options.files_dir / file_id).write_bytes(content)
        bucket_copy.push(self.options, self.options.files_dir / file_id)
        self.store.add_file(job["tenant"], file_id, "step_metrics.csv", "fine-tune-results", len(content))
        name = fine_tuned_model_name(job)
        new_events = [e for e in [diagnosis_event(report)] if e]
        billed = report.get("tokens_billed", report.get("tokens_processed"))  # rules/billing.py: what was billed
        ended = {**job, "status": "succeeded", "trained_tokens": billed}
        new_events.append({"message": "The job has successfully completed", "data": {"usage": usage.job_usage(ended)}})
        done = self._update(
            job["id"],
            token,
            "succeed",
            {
                "finished_at": now(),
                "fine_tuned_model": name,
                "trained_tokens": billed,
                "result_files": [file_id],
                "report": _jsonable(report),
            },
            new_events,
        )
        if not done:
            self.store.delete_file(job["tenant"], file_id)
            (self.options.files_dir / file_id).unlink(missing_ok=True)

    # ------------------------------------------------------------------ run folder -> events, checkpoints

    def _sync(self, job: dict, token: str, run: Path) -> None:
        bucket_copy.pull_run(self.options, job["id"])  # --storage: the trainer writes the bucket, wherever it runs
        plan = run_folders.read_plan(run) or {}
        rows = run_folders.read_metrics(run)
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
        kept = {
            step: checkpoint_metrics(by_step.get(step, {"step": step})) for step in run_folders.checkpoint_steps(run)
        }
        self.store.sync_checkpoints(job["id"], token, kept, fine_tuned_model_name(job))


class LeaseKeeper(threading.Thread):
    """Renews a claimed job's lease every heartbeat for as long as this worker holds it, and notes the job's
    status (a cancel or pause shows up here) or that the lease went to another worker."""

    def __init__(self, store: Store, job_id: str, token: str, options: ServiceOptions) -> None:
        super().__init__(name=f"lease-{job_id}", daemon=True)
        self.store, self.job_id, self.token, self.options = store, job_id, token, options
        self.seen: tuple[float, str | None] = (0.0, None)  # (when the last beat began, the status it read)
        self.lost = False
        self._done = threading.Event()

    def status_since(self, t: float) -> str | None:
        """The job's status as read by a beat that began after `t` (time.monotonic; None: none has yet): a beat
        that read `queued` just before the worker wrote the job's start must not read as a cancel or a pause."""
        began, status = self.seen
        return status if began > t else None

    def run(self) -> None:
        while not self._done.wait(self.options.heartbeat_seconds):
            try:
                began = time.monotonic()
                self.seen = (began, self.store.heartbeat(self.job_id, self.token, self.options.lease_seconds))
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
