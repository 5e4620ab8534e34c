"""`--launcher ray` on a real two-node Ray cluster started on this machine, torn down at the end.

ray.cluster_utils.Cluster starts a head and a second node (separate raylets), one CPU each: a 2-device run must put
one rank on each node. The service's jobs go through a real `finetune serve` (API only) and a real
`finetune worker --launcher ray`; the references are the same job run by a local worker (the Worker class, its
default launcher) and the same run in one process. Cost: see docs/distributed.md, "On a Ray cluster".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from openai import OpenAI
from safetensors.torch import load_file
from service_helpers import EXAMPLES, Server, settings_for

from finetune.commands.cli import main
from finetune.service.storage import run_folders
from finetune.service.storage.store import Store
from finetune.service.workers.worker import Worker

pytest.importorskip("ray")

TRAIN = EXAMPLES / "train.jsonl"
SEED = 3
STEPS = 10
HYPER = {"n_epochs": 1, "batch_size": 4, "max_seq_len": 256, "val_fraction": 0, "save_every": 2, "max_steps": STEPS,
         "learning_rate": 1e-3, "devices": 2}  # fmt: skip
# the same run as HYPER, on the command line
CLI_FLAGS = ["--epochs", "1", "--batch-size", "4", "--max-seq-len", "256", "--val-fraction", "0", "--save-every", "2",
             "--max-steps", str(STEPS), "--lr", "1e-3", "--seed", str(SEED)]  # fmt: skip
ADAPTER = "adapter/adapter_model.safetensors"
# tests/integration/test_distributed.py's tolerance for 2 processes vs 1 with accumulation 2, measured there at
# lr 1e-3 (AdamW turns the rounding of a sum in another order into weight differences that grow with the rate)
WEIGHTS_ATOL = 1e-5
NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "include_dashboard": False}
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage report attempted from a machine without the internet
FINAL = ("succeeded", "failed", "cancelled")


def _processes() -> dict[int, str]:
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return found


def _ray_processes(temp: str) -> dict[int, str]:
    """The cluster's own processes (they name its folder) and Ray's workers (titled ray::...)."""
    return {pid: line for pid, line in _processes().items() if temp in line or line.startswith("ray::")}


def _rank_actors() -> list[int]:
    return [pid for pid, line in _processes().items() if line.startswith("ray::RankProcess")]


def _trainers(run: Path) -> dict[int, int]:
    """rank -> pid of the trainer processes writing `run`."""
    found = {}
    for pid, line in _processes().items():
        if f"--out {run}" in line and "finetune train" in line:
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = next((int(v[5:]) for v in env if v.startswith(b"RANK=")), None)
            if rank is not None:
                found[rank] = pid
    return found


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _nodes_of(text: str) -> list[str]:
    """The node of each rank, from the launcher's `Ray: N rank(s) placed: rank 0 on node ID (IP), ...` line."""
    placed = re.search(r"Ray: \d+ rank\(s\) placed: (.*)", text)
    assert placed, text[-3000:]
    return re.findall(r"rank \d+ on node (\w+)", placed.group(1))


def _same_weights(got: Path, expected: Path, atol: float) -> None:
    a, b = load_file(got), load_file(expected)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=atol), (name, float((a[name] - b[name]).abs().max()))


def _wait_for(condition, timeout: float, what: str, poll: float = 0.1, context=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(poll)
    raise AssertionError(f"waited {timeout:.0f} s for {what}\n{context()}")


# ----------------------------------------------------------------------------- the cluster, the service


@pytest.fixture(scope="module")
def ray_local_cluster(request):
    """A head and a second node, one CPU each; every process of theirs gone at the end (checked in /proc). Each node
    has its own cache folder (FINETUNE_CACHE: node-local, as on separate machines) and, when the S3 server runs,
    the bucket's credentials in its environment (as a pod has them from a Secret)."""
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ftray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    before = set(_ray_processes(temp))
    # RAY_TMPDIR: Ray's own files (the current cluster's address among them) in this folder, not /tmp/ray, which
    # a fresh machine does not have
    env = {**RAY_ENV, "RAY_TMPDIR": temp, **_bucket_env(request), "FINETUNE_CACHE": f"{temp}/node-a-cache"}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    from ray._common.utils import get_ray_address_file

    Path(get_ray_address_file(None)).parent.mkdir(parents=True, exist_ok=True)  # Ray writes there, makes it not
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={**NODE, "temp_dir": temp})
        os.environ["FINETUNE_CACHE"] = f"{temp}/node-b-cache"  # the second node's processes inherit its own
        cluster.add_node(**NODE)
        os.environ["FINETUNE_CACHE"] = saved["FINETUNE_CACHE"] or ""
        yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
        deadline = time.monotonic() + 30
        while (left := set(_ray_processes(temp)) - before) and time.monotonic() < deadline:
            time.sleep(0.5)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes left running: {[_processes().get(pid, '')[:120] for pid in left]}"


def _bucket_env(request) -> dict[str, str]:
    """The S3 server's AWS_* variables for the nodes (none when moto is not installed: that test skips)."""
    try:
        server = request.getfixturevalue("s3_server")
    except pytest.skip.Exception:
        return {}
    return {**server.env, "FINETUNE_STORAGE_CONFIG": "/nonexistent/storage.yaml"}


@pytest.fixture(scope="module")
def ray_cluster(ray_local_cluster) -> str:
    """The cluster's address."""
    return ray_local_cluster.address


@dataclass
class Service:
    server: Server
    client: OpenAI
    file_id: str
    ray_address: str | None = None
    worker: subprocess.Popen | None = None

    @property
    def worker_log(self) -> Path:
        return self.server.data_dir.parent / "ray-worker.log"

    def start_worker(self, *extra: str) -> None:
        """A `finetune worker --launcher ray` (its lease short enough that a killed one's job is taken soon)."""
        command = [sys.executable, "-m", "finetune", "worker", "--data-dir", str(self.server.data_dir), "--launcher",
                   "ray", "--ray-address", self.ray_address, "--heartbeat-seconds", "0.5", "--lease-seconds", "8",
                   *extra]  # fmt: skip
        with open(self.worker_log, "ab") as log:
            self.worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def stop_worker(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()

    def create(self, **hyper) -> str:
        job = self.client.fine_tuning.jobs.create(
            model="toy",
            training_file=self.file_id,
            seed=SEED,
            method={"type": "supervised", "supervised": {"hyperparameters": {**HYPER, **hyper}}},
        )
        return job.id

    def finished(self, job_id: str, timeout: float = 300):
        return _wait_for(
            lambda: (job := self.client.fine_tuning.jobs.retrieve(job_id)).status in FINAL and job,
            timeout,
            f"job {job_id} to end",
            poll=0.5,
            context=lambda: self.server.output()[-2000:] + (self.worker_log.read_text()[-3000:] if self.worker else ""),
        )

    def run(self, job_id: str) -> Path:
        return self.server.data_dir / "runs" / job_id

    def log(self, job_id: str, attempt: int = 1) -> str:
        return (self.server.data_dir / "logs" / f"{job_id}-attempt-{attempt}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def ray_service(ray_cluster, toy_model, tmp_path_factory):
    """`finetune serve --workers 0` and one `finetune worker --launcher ray --ray-address ADDR`."""
    server = Server(tmp_path_factory.mktemp("ray-service") / "data", toy_model, workers=0)
    client = OpenAI(base_url=server.url, api_key=server.key, max_retries=0)
    file = client.files.create(file=("train.jsonl", TRAIN.read_bytes()), purpose="fine-tune")
    service = Service(server, client, file.id, ray_cluster)
    try:
        service.start_worker()
        yield service
    finally:
        service.stop_worker()
        server.stop()


@pytest.fixture(scope="module")
def ray_job(ray_service) -> Path:
    """A 2-device job on the Ray cluster, uninterrupted: its run folder."""
    job_id = ray_service.create()
    job = ray_service.finished(job_id)
    assert job.status == "succeeded", (job.error, ray_service.log(job_id)[-3000:])
    assert job.attempts == 1
    return ray_service.run(job_id)


# ----------------------------------------------------------------------------- the tests


@pytest.mark.timeout(600)
def test_a_two_device_job_on_ray_learns_what_local_workers_learn(ray_service, ray_job, toy_model, tmp_path):
    """The job's 2 ranks ran on the cluster's 2 nodes; its weights are those of the same job run by a local worker
    (`--devices 2`: torchrun's 2 processes on this machine) and of 1 process with accumulation 2."""
    nodes = _nodes_of(ray_service.log(ray_job.name))
    assert len(nodes) == 2 and len(set(nodes)) == 2  # one rank on each node: the run crossed nodes
    assert [row["step"] for row in run_folders.read_metrics(ray_job)] == list(range(1, STEPS + 1))

    ray_service.stop_worker()  # the same job again, for a local worker (the Worker class, its default launcher)
    try:
        job_id = ray_service.create()
        store = Store(f"sqlite:///{ray_service.server.data_dir / 'finetune.db'}")
        try:
            assert Worker(settings_for(ray_service.server.data_dir, toy_model, heartbeat_seconds=0.5), store).run_once()
        finally:
            store.close()
    finally:
        ray_service.start_worker()
    job = ray_service.client.fine_tuning.jobs.retrieve(job_id)
    assert job.status == "succeeded", (job.error, ray_service.log(job_id)[-3000:])
    assert "Ray:" not in ray_service.log(job_id)  # it ran here, not on the cluster
    _same_weights(ray_job / ADAPTER, ray_service.run(job_id) / ADAPTER, WEIGHTS_ATOL)

    one = tmp_path / "one"  # the same run in one process, accumulating 2 micro-batches per step
    assert (
        main(["train", str(TRAIN), "--model", str(toy_model), "--out", str(one), *CLI_FLAGS, "--grad-accum", "2"]) == 0
    )
    _same_weights(ray_job / ADAPTER, one / ADAPTER, WEIGHTS_ATOL)


@pytest.mark.timeout(600)
def test_a_killed_rank_resumes_once_with_the_weights_of_an_uninterrupted_run(ray_service, ray_job):
    """SIGKILL to the Ray worker process of rank 1 mid-run: the job resumes from its last checkpoint on a new set
    of ranks (attempt 2) and ends with the uninterrupted run's weights, bit for bit."""
    job_id = ray_service.create()
    run = ray_service.run(job_id)
    trainers = _wait_for(
        lambda: run_folders.checkpoint_steps(run) and len(t := _trainers(run)) == 2 and t,
        300,
        "a checkpoint of the run",
    )
    actor = _parent(trainers[1])
    assert _processes()[actor].startswith("ray::RankProcess"), _processes()[actor]
    os.kill(actor, signal.SIGKILL)
    done_at_kill = len(run_folders.read_metrics(run))
    assert done_at_kill < STEPS, "the run ended before the kill: make it longer"

    job = ray_service.finished(job_id)
    assert job.status == "succeeded", (job.error, ray_service.log(job_id, 2)[-3000:])
    assert job.attempts == 2
    assert "error: rank 1 was lost with its Ray worker process or node" in ray_service.log(job_id, 1)
    assert not (ray_service.server.data_dir / "logs" / f"{job_id}-attempt-3.log").exists()
    messages = [e.message for e in ray_service.client.fine_tuning.jobs.list_events(job_id, limit=100)]
    assert any("died at step" in m and "SIGKILL" in m for m in messages), messages
    assert any(m.startswith("Resuming from step") for m in messages), messages
    assert sum("successfully completed" in m for m in messages) == 1
    assert [row["step"] for row in run_folders.read_metrics(run)] == list(range(1, STEPS + 1))
    _same_weights(run / ADAPTER, ray_job / ADAPTER, atol=0.0)


@pytest.mark.timeout(600)
def test_a_killed_worker_leaves_no_rank_running_and_the_job_resumes_once(ray_service, ray_job):
    """kill -9 the `finetune worker --launcher ray` mid-run: its ranks die with it (Ray ends the actors of a driver
    that died), so no rank of attempt 1 runs on when another worker takes the job; that one resumes it."""
    job_id = ray_service.create()
    run = ray_service.run(job_id)
    _wait_for(lambda: run_folders.checkpoint_steps(run) and len(_trainers(run)) == 2, 300, "a checkpoint of the run")
    ray_service.worker.kill()
    ray_service.worker.wait()
    assert len(run_folders.read_metrics(run)) < STEPS, "the run ended before the kill: make it longer"
    _wait_for(lambda: not _trainers(run) and not _rank_actors(), 60, "the ranks to end with their worker")
    assert ray_service.client.fine_tuning.jobs.retrieve(job_id).status == "running"  # until its lease runs out

    ray_service.start_worker()
    job = ray_service.finished(job_id)
    assert job.status == "succeeded", (job.error, ray_service.log(job_id, 2)[-3000:])
    assert job.attempts == 2
    messages = [e.message for e in ray_service.client.fine_tuning.jobs.list_events(job_id, limit=100)]
    assert any("its worker stopped answering" in m for m in messages), messages
    assert [row["step"] for row in run_folders.read_metrics(run)] == list(range(1, STEPS + 1))
    _same_weights(run / ADAPTER, ray_job / ADAPTER, atol=0.0)


@pytest.mark.timeout(600)
def test_cancel_mid_run_stops_every_rank_with_a_checkpoint(ray_service):
    # long enough that the cancel lands mid-run on a quiet machine (the toy takes 10 steps in about a second); the
    # only checkpoint is the one the stop writes
    job_id = ray_service.create(n_epochs=40, max_steps=1000, save_every=2000)
    run = ray_service.run(job_id)
    _wait_for(lambda: len(run_folders.read_metrics(run)) >= 2, 300, "two steps of the run")
    ray_service.client.fine_tuning.jobs.cancel(job_id)
    _wait_for(lambda: "stopped by SIGTERM" in ray_service.log(job_id), 120, "the ranks to stop")
    _wait_for(lambda: not _trainers(run) and not _rank_actors(), 120, "the ranks and their actors to be gone")
    assert ray_service.client.fine_tuning.jobs.retrieve(job_id).status == "cancelled"
    steps = run_folders.checkpoint_steps(run)
    assert len(steps) == 1 and 2 <= steps[0] < 1000
    assert f"stopped by SIGTERM after step {steps[0]}" in ray_service.log(job_id)
    time.sleep(3)  # a worker that started the job again would have started its ranks by now
    assert not _trainers(run) and not _rank_actors()


@pytest.mark.timeout(600)
def test_finetune_train_on_ray_from_the_command_line(ray_cluster, ray_job, toy_model, tmp_path):
    """`finetune train ... --devices 2 --launcher ray --ray-address ADDR`: planned here once, the ranks on both
    nodes, the report alone on stdout, the weights of the same run as a service job."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "finetune", "train", str(TRAIN), "--model", str(toy_model), "--out", str(out),
               *CLI_FLAGS, "--devices", "2", "--launcher", "ray", "--ray-address", ray_cluster, "--json"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)  # stdout holds the report and nothing else
    assert report["steps_taken"] == STEPS
    assert len(set(_nodes_of(result.stderr))) == 2
    assert (out / "launch-plan.json").is_file() and json.loads((out / "plan.json").read_text())["devices"] == 2
    _same_weights(out / ADAPTER, ray_job / ADAPTER, atol=0.0)
    assert not _rank_actors()


@pytest.mark.timeout(600)
def test_a_two_node_run_into_a_bucket_shares_no_path(ray_cluster, ray_local_cluster, ray_job, s3_server, toy_model,
                                                     tmp_path, monkeypatch):  # fmt: skip
    """`finetune train --launcher ray --devices 2 --out s3://…`: one rank on each node, each with its own cache folder
    and nothing else of this machine's: the data and the base reach them through the bucket, rank 0 writes the run
    there, and its weights are bit for bit those of the same run as a service job into a local folder."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FINETUNE_STORAGE_CONFIG", "/nonexistent/storage.yaml")
    bucket = s3_server.new_bucket()
    uri = f"s3://{bucket}/runs/ray"
    data = tmp_path / "private" / "train.jsonl"  # a folder no rank is told about
    data.parent.mkdir()
    shutil.copy(TRAIN, data)
    command = [sys.executable, "-m", "finetune", "train", str(data), "--model", str(toy_model), "--out", uri,
               "--devices", "2", "--launcher", "ray", "--ray-address", ray_cluster, *CLI_FLAGS]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=500, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    nodes = _nodes_of(done.stderr)
    assert len(nodes) == 2 and len(set(nodes)) == 2
    stored = s3_server.objects(bucket, "runs/ray/")
    assert "runs/ray/report.json" in stored and f"runs/ray/{ADAPTER}" in stored
    assert any(key.startswith("runs/ray/inputs/model-") for key in stored)  # the base, for the nodes
    temp = ray_local_cluster.head_node.get_session_dir_path().split("/session_")[0]
    caches = [Path(temp) / "node-a-cache", Path(temp) / "node-b-cache"]
    assert all((cache / "runs").is_dir() for cache in caches)  # each node wrote only its own copy
    got = tmp_path / "adapter.safetensors"
    s3_server.client().download_file(bucket, f"runs/ray/{ADAPTER}", str(got))
    _same_weights(got, ray_job / ADAPTER, atol=0.0)
    assert not _rank_actors()


PLACEMENT_S = 12  # the worker's --placement-timeout in the next test
WAITING = "Waiting for 2 CPUs on the Ray cluster: 1 available"


def _events(service: Service, job_id: str) -> list[str]:
    return [e.message for e in service.client.fine_tuning.jobs.list_events(job_id, limit=100)]


def _readyz(service: Service) -> dict:
    with urllib.request.urlopen(service.server.url.removesuffix("/v1") + "/readyz", timeout=10) as answer:
        return json.loads(answer.read())


@pytest.mark.timeout(600)
def test_a_lost_node_makes_a_job_wait_said_and_bounded_and_cancel_and_sigterm_free_the_worker(
    ray_local_cluster, ray_service
):
    """Issue 35: the node of a job's rank 1 is lost mid-run (the job waited `queued` with nothing said, then
    `running` with no rank, and the worker ignored a cancel and SIGTERM). Now the resumed attempt says it waits for
    the cluster (an event, /readyz), ends after the placement timeout with the reason, and a cancel or a SIGTERM
    during the wait frees the worker at once. Last in the module: it takes a node away (and gives it back)."""
    service, cluster = ray_service, ray_local_cluster
    service.stop_worker()
    ready = service.worker_log.read_text().count(" ready (")
    service.start_worker("--placement-timeout", str(PLACEMENT_S))
    next_id = None
    try:
        _wait_for(lambda: service.worker_log.read_text().count(" ready (") > ready, 120, "the worker to start")
        job_id = service.create(n_epochs=40, max_steps=1000, save_every=2)
        run = service.run(job_id)
        _wait_for(
            lambda: run_folders.checkpoint_steps(run) and len(_trainers(run)) == 2, 300, "a checkpoint of the run"
        )
        (node,) = cluster.worker_nodes
        cluster.remove_node(node)  # its raylet and Ray workers killed: rank 1 and its trainer with them

        _wait_for(lambda: any(m.startswith(WAITING) for m in _events(service, job_id)), 180, "the wait to be said")
        assert any("died at step" in m for m in _events(service, job_id))  # attempt 1, resumed as attempt 2
        answer = _wait_for(lambda: (a := _readyz(service)).get("waiting") and a, 10, "/readyz to say it")
        assert answer["status"] == "ready" and answer["waiting"][0]["message"].startswith(WAITING), answer
        ended = _wait_for(
            lambda: [m for m in _events(service, job_id) if m.startswith("The attempt ended at step")],
            PLACEMENT_S + 60,
            "the placement timeout",
        )
        assert f"within the placement timeout ({PLACEMENT_S} s; 1 available)); resuming" in ended[0], ended
        assert not _rank_actors() and not _trainers(run)

        # attempt 3 waits in turn: a cancel ends it, and the worker takes the next job at once
        _wait_for(lambda: sum(m.startswith(WAITING) for m in _events(service, job_id)) == 2, 60, "attempt 3's wait")
        next_id = service.create()
        service.client.fine_tuning.jobs.cancel(job_id)
        cancelled = time.monotonic()
        _wait_for(lambda: service.client.fine_tuning.jobs.retrieve(next_id).status != "queued", 20, "the next job")
        print(f"next job taken {time.monotonic() - cancelled:.1f} s after the cancel")
        assert service.client.fine_tuning.jobs.retrieve(job_id).status == "cancelled"

        # SIGTERM while that one waits: the worker queues it again and ends
        _wait_for(lambda: any(m.startswith(WAITING) for m in _events(service, next_id)), 120, "the next job's wait")
        service.worker.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert service.worker.wait(timeout=30) == 0
        print(f"worker ended {time.monotonic() - stopped:.1f} s after SIGTERM")
        assert service.client.fine_tuning.jobs.retrieve(next_id).status == "queued"
        assert "Worker stopping; the job is queued again" in _events(service, next_id)
    finally:
        if next_id:
            with contextlib.suppress(Exception):  # ended already
                service.client.fine_tuning.jobs.cancel(next_id)
        service.stop_worker()
        cluster.add_node(**NODE)
        service.start_worker()
