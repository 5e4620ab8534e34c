"""The worker's launcher seam: the jobs a worker takes are the ones its launcher can hold (a Ray cluster's devices,
not this machine's), and a cancel reaches the trainer through the launcher's stop."""

from __future__ import annotations

import shutil
import time

from service_helpers import settings_for

from finetune.service.storage.store import Store, new_id
from finetune.service.workers.worker import Worker
from finetune.settings.errors import ERROR_FILE_ENV
from finetune.settings.wording import AUDIENCE_ENV


class ClusterOf:
    """A stand-in launcher for a cluster with `n` devices: it never starts anything here."""

    name = "ray"

    def __init__(self, n: int) -> None:
        self.n = n

    def devices(self) -> int:
        return self.n

    def device_kind(self) -> str:
        return "cpu"

    def start(self, run):
        raise AssertionError("no job fits, none is started")


class CancelledWhileRunning:
    """A stand-in trainer: the job is cancelled while it runs; it stops (exit 143) once asked to."""

    def __init__(self, store: Store, job_id: str) -> None:
        self.store, self.job_id = store, job_id
        self.stopped = self.killed = False
        self.store.transition("a", job_id, "cancel")

    def wait(self, timeout: float | None = None) -> int | None:
        if self.stopped:
            return 143
        time.sleep(timeout or 0)
        return None

    def stop(self) -> None:
        self.stopped = True

    def kill(self) -> None:
        self.killed = True


class Recording(ClusterOf):
    def __init__(self, store: Store) -> None:
        super().__init__(1)
        self.store = store
        self.runs: list = []

    def start(self, run):
        self.runs.append(run)
        self.trainer = CancelledWhileRunning(self.store, run.out.name)
        return self.trainer


def _service_with_a_job(tmp_path, toy_model, tiny_data, **run_settings):
    settings = settings_for(tmp_path / "d", toy_model, heartbeat_seconds=0.1)
    settings.make_dirs()
    store = Store(settings.database_url)
    store.migrate()
    file_id = new_id("file")
    shutil.copy(tiny_data, settings.files_dir / file_id)
    store.add_file("a", file_id, "tiny.jsonl", "fine-tune", tiny_data.stat().st_size)
    values = dict(model="toy", model_location=settings.models["toy"], training_file=file_id, seed=1,
                  method={"type": "supervised"}, run_settings={"max_steps": 1, **run_settings})  # fmt: skip
    return settings, store, store.create_job("a", values)["id"]


def test_a_cancel_reaches_the_trainer_through_the_launcher(tmp_path, toy_model, tiny_data):
    settings, store, job_id = _service_with_a_job(tmp_path, toy_model, tiny_data)
    launcher = Recording(store)
    assert Worker(settings, store, launcher=launcher).run_once()
    (run,) = launcher.runs
    assert run.plan == settings.runs_dir / f"{job_id}.plan.json" and run.out == settings.runs_dir / job_id
    assert run.log == settings.logs_dir / f"{job_id}-attempt-1.log" and not run.resume
    assert run.env[AUDIENCE_ENV] == "api:supervised" and run.env[ERROR_FILE_ENV].endswith("-attempt-1.error.json")
    assert launcher.trainer.stopped and not launcher.trainer.killed  # a checkpoint at the step boundary, not a kill
    job = store.get_job("a", job_id)
    assert job["status"] == "cancelled" and job["worker"] is None
    store.close()


def test_a_worker_takes_the_jobs_its_launcher_can_hold(tmp_path, toy_model, tiny_data):
    settings, store, _ = _service_with_a_job(tmp_path, toy_model, tiny_data, devices=16)
    worker = Worker(settings, store, launcher=ClusterOf(8))
    assert worker.max_devices == 8 and not worker.run_once()  # 16 devices: more than the cluster has now
    worker.launcher.n = 16  # the cluster grew (another node joined)
    assert worker.max_devices == 16
    assert (
        Worker(settings_for(tmp_path / "d", toy_model, worker_devices=4), store, launcher=ClusterOf(16)).max_devices
        == 4
    )
    store.close()


WAITING = "Waiting for 2 CPUs on the Ray cluster: 1 available (the attempt ends if they are not free within the placement timeout, 1 s)"  # noqa: E501
NOT_PLACED = (
    "the Ray cluster did not have 2 CPUs free for the run's ranks within the placement timeout (1 s; 1 available)"
)


class NeverPlaced:
    """A stand-in for a Ray run whose ranks wait for the cluster, then are not placed in time (RAY_FAILED)."""

    failure = None

    def __init__(self, worker_of) -> None:
        self.worker_of, self.calls, self.seen = worker_of, 0, None
        self.waiting = WAITING

    def wait(self, timeout: float | None = None) -> int | None:
        self.calls += 1
        if self.calls < 4:
            time.sleep(timeout or 0)
            self.seen = self.worker_of().waiting  # what the worker's heartbeat gives /readyz
            return None
        self.waiting, self.failure = None, NOT_PLACED
        return 75

    def stop(self) -> None: ...
    def kill(self) -> None: ...


class Unplaceable(ClusterOf):
    def __init__(self) -> None:
        super().__init__(2)
        self.trainers: list[NeverPlaced] = []

    def start(self, run):
        self.trainers.append(NeverPlaced(lambda: self.worker))
        return self.trainers[-1]


def test_a_run_waiting_for_the_cluster_says_so_and_an_unplaced_attempt_ends_clearly(tmp_path, toy_model, tiny_data):
    """Issue 35: a job whose node was lost sat with nothing said. Its wait is an event (once an attempt), the
    worker's state for /readyz while it lasts; an attempt not placed in time is retried, and the third fails the job
    with the reason."""
    settings, store, job_id = _service_with_a_job(tmp_path, toy_model, tiny_data, devices=2)
    launcher = Unplaceable()
    launcher.worker = Worker(settings, store, launcher=launcher)
    for _ in range(3):
        assert launcher.worker.run_once()
    first = launcher.trainers[0]
    assert first.seen["job"] == job_id and first.seen["message"] == WAITING and launcher.worker.waiting is None
    messages = [e["message"] for e in store.list_events("a", job_id, None, 100).rows]
    assert messages.count(WAITING) == 3  # once per attempt, not per heartbeat
    assert f"The attempt ended at step 0 ({NOT_PLACED}); resuming from its last checkpoint" in messages
    job = store.get_job("a", job_id)
    assert job["status"] == "failed" and job["attempts"] == 3
    assert job["error"]["message"] == f"the attempt ended 3 times at step 0 ({NOT_PLACED}); not retrying"
    store.close()


def test_readyz_says_what_a_job_waits_for_without_failing(tmp_path, toy_model):
    from fastapi.testclient import TestClient

    from finetune.service.dashboard.app import create_app

    settings = settings_for(tmp_path / "d", toy_model)
    app = create_app(settings)
    store = app.state.store
    with TestClient(app) as client:
        assert "waiting" not in client.get("/readyz").json()
        store.workers.register("h:1", "h", 1, 2, "cpu")
        store.workers.heartbeat("h:1", waiting={"job": "ftjob-x", "message": WAITING, "since": int(time.time()) - 5})
        answer = client.get("/readyz")
        assert answer.status_code == 200 and answer.json()["status"] == "ready"
        (waiting,) = answer.json()["waiting"]
        assert waiting["message"] == WAITING and 5 <= waiting["seconds"] < 60
        assert answer.json()["warnings"] == [f"a job has waited {waiting['seconds']} s: {WAITING}"]
        assert "ftjob-x" not in answer.text  # no job (nor tenant) named to whoever reaches the port
        store.workers.heartbeat("h:1")
        assert "waiting" not in client.get("/readyz").json()
    store.close()


def test_placement_timeout_goes_with_the_ray_launcher():
    import pytest

    from finetune.settings.errors import UserError
    from finetune.train.launchers import launcher_for

    with pytest.raises(UserError, match="--placement-timeout goes with --launcher ray"):
        launcher_for("local", None, 30)


class LateBeats(Store):
    """A store whose lease beats that read `queued` return only once the worker has written the job's start: a beat
    slowed by a loaded machine, racing the start."""

    def heartbeat(self, job_id: str, token: str, lease_seconds: float) -> str:
        status = super().heartbeat(job_id, token, lease_seconds)
        deadline = time.monotonic() + 30
        while status == "queued" and self.get_job_any(job_id)["status"] != "running" and time.monotonic() < deadline:
            time.sleep(0.01)
        return status


class Watched:
    """A stand-in trainer that runs a few heartbeats, noting a stop, then ends as stopped or as a death."""

    waiting = failure = None

    def __init__(self) -> None:
        self.calls, self.stopped = 0, False

    def wait(self, timeout: float | None = None) -> int | None:
        self.calls += 1
        time.sleep(timeout or 0)
        return (143 if self.stopped else 1) if self.calls > 5 else None

    def stop(self) -> None:
        self.stopped = True

    def kill(self) -> None: ...


def test_a_beat_that_read_queued_before_the_start_is_not_taken_for_a_cancel(tmp_path, toy_model, tiny_data):
    """Seen on a loaded machine (issue 35's Ray runs): the lease's beat read `queued` (planned) just before the
    worker wrote the job's start, and the worker took it for a cancel or pause: it stopped the trainer it had just
    started, and the job was queued again as a new attempt."""
    settings, store, job_id = _service_with_a_job(tmp_path, toy_model, tiny_data)
    store.close()
    store = LateBeats(settings.database_url)
    trainer = Watched()
    launcher = ClusterOf(1)
    launcher.start = lambda run: trainer
    assert Worker(settings, store, launcher=launcher).run_once()
    assert trainer.calls > 5 and not trainer.stopped
    store.close()
