"""`--launcher ray`: a run's ranks on a Ray cluster, one Ray actor per rank, each running the project's own trainer.

    a placement group of `devices` bundles, PACK: {GPU: 1, CPU: 1} each on a cluster with GPUs, {CPU: 1} without
    rank r: an actor named finetune-<run>-rank<r> (namespace "finetune") in bundle r, starting
        python -m finetune train --plan PLAN --out OUT [--resume]
    with RANK=r, WORLD_SIZE, LOCAL_RANK=0 (Ray shows each GPU rank its one GPU), MASTER_ADDR = rank 0's node,
    MASTER_PORT = a free port there: init_distributed joins the process group exactly as under torchrun.

The trainer, its checkpoints, its SIGTERM handling and its bit-identical resume are the local ones; Ray only places
the processes. A stop is SIGTERM to every rank (each checkpoints after the same step); a rank that dies, or whose
node is lost, ends the run as a killed process (-SIGKILL), which the worker resumes from the last checkpoint. Before
a run starts, whatever is left of an earlier run into the same OUT (actors, placement group) is killed and waited
for: a run never has two sets of ranks. While the placement group waits for the cluster's resources, `waiting` says
so; the placement timeout ends a wait (RAY_FAILED, with `failure`), and every wait looks at a stop or a kill each
WAIT_SLICE_S. docs/distributed.md, "On a Ray cluster", says why not Ray Train.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from finetune.bucket.uri import is_remote, name_of
from finetune.rules.memory import device_for_name
from finetune.settings.errors import UserError
from finetune.train.launch import DEFAULT_SHUTDOWN_TIMEOUT_S, STOP_SIGNALS
from finetune.train.ray_rank import RankProcess
from finetune.train.trainer_run import TrainerRun

RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable: `--ray-address` defaults to it
NAMESPACE = "finetune"
FORWARDED_ENV = ("FINETUNE_COLLECTIVE_TIMEOUT",)  # the driver's settings of a run; the rest is each node's own
POLL_S = 0.25
WAIT_SLICE_S = 1.0  # the longest any wait on the cluster goes without looking at a stop or a kill
PLACEMENT_TIMEOUT_S = 300  # `--placement-timeout`: the ranks placed (then, again, started), or the attempt ends
START_MIN_S = 60  # placed ranks get at least this long to start (a busy node is slow to start a Ray worker process)
TELL_AFTER_S = 10  # a placement that waits this long says so, even when the cluster seems to have room
FAILURE_GRACE_S = 15  # after one rank fails, time the others get to fail on their own (and say why)
GONE_TIMEOUT_S = 60  # killed actors gone from the cluster
RAY_FAILED = 75  # the run could not go on for a reason of the cluster's (EX_TEMPFAIL: try again)
INSTALL = "pip install 'finetune[ray]'"
REACH_TIMEOUT_S = 10


class Killed(Exception):
    """The caller killed the run (Trainer.kill) while it was starting."""


class Stopped(Exception):
    """The caller stopped the run (Trainer.stop) before its ranks had started: nothing to checkpoint."""


class NotPlaced(Exception):
    """The ranks were not placed and started within the placement timeout."""


@dataclass
class RankEnd:
    rank: int
    code: int | None
    """Its trainer's exit code (Popen's: minus a signal's number); None when its actor or node was lost."""
    record: dict | None
    """Its failure record (distributed.record_failure), when it wrote one."""
    at: float
    ended_by_us: bool = False
    """Killed by this launcher after another rank failed, or after a stop ran out of time: not a cause."""


def outcome(ends: list[RankEnd], stopped: bool) -> tuple[int, str | None]:
    """The run's exit code from its ranks' ends, and the line that names the cause (None: the ranks said it)."""
    if all(end.code == 0 for end in ends):
        return 0, None
    stop_codes = {128 + s for s in STOP_SIGNALS} | {-s for s in STOP_SIGNALS}
    recorded = [end for end in ends if end.record]
    causes = [end for end in recorded if not end.record.get("lost_contact")]
    if causes:
        first = min(causes, key=lambda end: end.record["time"])
        return 1, f"error: rank {first.rank} failed first: {first.record['message']}"
    lost = [
        end
        for end in ends
        if not end.ended_by_us and (end.code is None or (end.code < 0 and end.code not in stop_codes))
    ]
    if lost:
        first = min(lost, key=lambda end: (end.at, end.rank))
        if first.code is None:
            return -signal.SIGKILL, f"error: rank {first.rank} was lost with its Ray worker process or node"
        return first.code, f"error: rank {first.rank} was killed by {signal.Signals(-first.code).name}"
    if not recorded and all(end.code == 0 or end.code in stop_codes for end in ends):
        code = next(end.code for end in ends if end.code != 0)
        return (128 - code if code < 0 else code), None if stopped else "error: the ranks were stopped by a signal"
    if recorded:  # every failure a lost contact, and no rank seen dying: the network between them
        return RAY_FAILED, f"error: the ranks lost contact with each other ({recorded[0].record['message']})"
    first = min((end for end in ends if end.code not in (0, None)), key=lambda end: (end.at, end.rank))
    return first.code, None if first.code == 1 else f"error: rank {first.rank} exited with {first.code}"


def run_key(out: Path | str) -> str:
    """The name a run's actors and placement group share: one per OUT folder (or bucket URI), whoever launches it."""
    where = out if is_remote(out) else str(Path(out).resolve())
    digest = hashlib.sha1(where.encode()).hexdigest()[:12]
    return f"finetune-{name_of(str(where))[:40]}-{digest}"


class RayLauncher:
    """Places each run's ranks on the Ray cluster at `address` (`--ray-address`, else $RAY_ADDRESS)."""

    name = "ray"

    def __init__(self, address: str | None, placement_timeout: float | None = None) -> None:
        self.placement_timeout = placement_timeout or PLACEMENT_TIMEOUT_S
        self._most = 0  # the most devices the cluster has had since this launcher joined it
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UserError(f"--launcher ray needs Ray, which is not installed: {INSTALL}") from None
        self.address = address or os.environ.get(RAY_ADDRESS_ENV)
        if not self.address:
            raise UserError(
                "--launcher ray needs --ray-address ADDR: the Ray cluster's head (HOST:6379), or auto on one of its nodes"
            )
        self._connect()

    def _connect(self) -> None:
        import ray

        if ray.is_initialized():
            return
        _check_reachable(self.address)  # ray.init waits on an address that does not answer, for many minutes
        try:
            ray.init(
                address=self.address,
                namespace=NAMESPACE,
                log_to_driver=False,  # the ranks' output comes through their actors; stdout stays the report's
                logging_level=logging.WARNING,
            )
        except (ConnectionError, ValueError, RuntimeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"--ray-address {self.address}: cannot join the Ray cluster ({first})") from None

    def _resources(self) -> dict:
        import ray

        return ray.cluster_resources()

    def devices(self) -> int:
        """The GPUs of the cluster, or on a cluster without GPUs its CPUs (one per rank): the most it has had since
        this launcher joined it, so that a job whose node was lost is taken again (its placement waits for the node,
        saying so, for at most the placement timeout) rather than left queued with nothing said."""
        resources = self._resources()
        self._most = max(self._most, int(resources.get("GPU", 0)) or int(resources.get("CPU", 0)))
        return self._most

    def device_kind(self) -> str | None:
        """ "cpu" on a cluster without GPUs; else the GPUs' kind as Ray names it (accelerator_type:A100), sized as
        the plan's table knows it; None when Ray does not say."""
        resources = self._resources()
        if not resources.get("GPU"):
            return "cpu"
        kinds = sorted(name.split(":", 1)[1] for name in resources if name.startswith("accelerator_type:"))
        if not kinds:
            return None
        return device_for_name(kinds[0], 0)  # no memory size: the smallest of the family, the safe estimate

    def start(self, run: TrainerRun) -> RayTrainer:
        """Starts at once: placing the ranks happens on the trainer's thread, where a failure of the cluster's ends the
        run as one to try again (RAY_FAILED), never the caller."""
        self._connect()
        local = {k: Path(v).resolve() for k, v in (("plan", run.plan), ("out", run.out)) if not is_remote(v)}
        run = dataclasses.replace(run, **local)  # the same path on every node; a bucket URI is one already
        return RayTrainer(run, self.placement_timeout)


def _check_reachable(address: str) -> None:
    """A HOST:PORT address (also ray://HOST:PORT) must accept a connection within a few seconds; `auto` is left to
    Ray, which finds the cluster of the node it runs on."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise UserError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); give the head node's address "
            "(HOST:6379, the port `ray start --head` printed)"
        ) from None


class RayTrainer:
    """One run's ranks on the cluster, started and watched by a thread of this process (see the module doc)."""

    def __init__(self, run: TrainerRun, placement_timeout: float = PLACEMENT_TIMEOUT_S) -> None:
        self.run = run
        self.placement_timeout = placement_timeout
        self.waiting: str | None = None
        """What the run waits for now, in a sentence (the cluster's resources); None once its ranks are placed."""
        self.failure: str | None = None
        """Why this launcher ended the run, when it did (the ranks were never placed); None: the ranks' own end."""
        self.gpus = False
        self.key = run_key(run.out)
        self.actors: list = []
        self.group = None
        self.returncode: int | None = None
        self._stop, self._kill, self._done = threading.Event(), threading.Event(), threading.Event()
        self._log = open(run.log, "ab") if run.log else None  # noqa: SIM115 (closed when the run has ended)
        self._thread = threading.Thread(target=self._main, name=f"ray-{self.key}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the Trainer protocol

    def wait(self, timeout: float | None = None) -> int | None:
        self._done.wait(timeout)
        return self.returncode if self._done.is_set() else None

    def stop(self) -> None:
        self._stop.set()

    def kill(self) -> None:
        self._kill.set()
        self._done.wait(GONE_TIMEOUT_S + 30)  # every wait of the run's thread looks at the kill each WAIT_SLICE_S

    # ------------------------------------------------------------------ output

    def _write(self, stream: str, data: bytes) -> None:
        if not data:
            return
        target = self._log or (sys.stdout.buffer if stream == "out" else sys.stderr.buffer)
        target.write(data)
        target.flush()

    def _say(self, line: str) -> None:
        self._write("err", line.encode() + b"\n")

    # ------------------------------------------------------------------ the run

    def _main(self) -> None:
        code = RAY_FAILED
        try:
            code = self._run()
        except Killed:
            code = -signal.SIGKILL
        except Stopped:
            self._say("error: stopped before the run started on the Ray cluster")
            code = 128 + signal.SIGTERM
        except NotPlaced as exc:
            self.failure = str(exc)
            self._say(f"error: {exc}")
        except Exception as exc:  # the cluster went away, or refused something: the run can be tried again
            self._say(f"error: the run on the Ray cluster failed: {type(exc).__name__}: {str(exc).strip()[:300]}")
        finally:
            try:
                self._teardown()
            except Exception as exc:
                self._say(f"warning: could not confirm the Ray actors of {self.key} are gone: {exc}")
            self.returncode = code
            if self._log:
                self._log.close()
            self._done.set()

    def _run(self) -> int:
        import ray

        devices = self.run.devices()
        self.gpus = bool(ray.cluster_resources().get("GPU"))
        self._clear_leftovers()
        self._reserve(devices, time.monotonic() + self.placement_timeout)
        deadline = time.monotonic() + max(self.placement_timeout, START_MIN_S)
        per_rank = {"num_cpus": 1, "num_gpus": 1 if self.gpus else 0}
        actor = ray.remote(RankProcess)
        strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy
        self.actors = [
            actor.options(
                name=f"{self.key}-rank{rank}",
                max_restarts=0,  # a lost rank ends the run; the worker resumes it, from the last checkpoint
                scheduling_strategy=strategy(self.group, placement_group_bundle_index=rank),
                **per_rank,
            ).remote()
            for rank in range(devices)
        ]
        where = self._get([a.where.remote() for a in self.actors], deadline)
        port = self._get(self.actors[0].free_port.remote(), deadline)
        placed = ", ".join(f"rank {r} on node {w['node'][:8]} ({w['ip']})" for r, w in enumerate(where))
        self._say(f"Ray: {devices} rank(s) placed: {placed}")
        shared = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
        rendezvous = {"WORLD_SIZE": str(devices), "MASTER_ADDR": where[0]["ip"], "MASTER_PORT": str(port)}
        ranks = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", **rendezvous}
        self._get(
            [
                a.start.remote(self.run.args(), {**shared, **self.run.env, **ranks, "RANK": str(r)}, os.getcwd())
                for r, a in enumerate(self.actors)
            ],
            deadline,
        )
        return self._watch(devices)

    def _clear_leftovers(self) -> None:
        """Kill what an earlier run into the same OUT left on the cluster, and wait until it is gone."""
        import ray

        leftovers = [name for name in ray.util.list_named_actors() if name.startswith(f"{self.key}-rank")]
        for name in leftovers:
            with contextlib.suppress(ValueError):  # gone meanwhile
                ray.kill(ray.get_actor(name), no_restart=True)
        with contextlib.suppress(ValueError):
            ray.util.remove_placement_group(ray.util.get_placement_group(self.key))
        if leftovers:
            self._say(f"Ray: killed {len(leftovers)} rank(s) left from an earlier run of {self.run.out.name}")
        self._wait_gone(leftovers)

    def _reserve(self, devices: int, deadline: float) -> None:
        """A placement group for the ranks. While the cluster has no room, `waiting` says for what (and the log, once
        for each count of free devices); a stop, a kill or the deadline ends the wait."""
        import ray

        what = "GPU" if self.gpus else "CPU"
        bundle = {"CPU": 1, "GPU": 1} if self.gpus else {"CPU": 1}
        self.group = ray.util.placement_group([bundle] * devices, strategy="PACK", name=self.key)
        ready, began = self.group.ready(), time.monotonic()
        free = None
        while not ray.wait([ready], timeout=WAIT_SLICE_S)[0]:
            now_free = int(ray.available_resources().get(what, 0))
            self._check(
                deadline,
                f"the Ray cluster did not have {devices} {what}s free for the run's ranks within the placement "
                f"timeout ({self.placement_timeout:g} s; {now_free} available)",
            )
            if now_free != free and (now_free < devices or time.monotonic() - began > TELL_AFTER_S):
                free = now_free
                self.waiting = (
                    f"Waiting for {devices} {what}s on the Ray cluster: {free} available (the attempt ends if they "
                    f"are not free within the placement timeout, {self.placement_timeout:g} s)"
                )
                self._say(f"Ray: {self.waiting}")
        self.waiting = None

    def _check(self, deadline: float, failure: str) -> None:
        """Between two slices of a wait: a kill, a stop, or the deadline (then `failure` says why) ends it."""
        if self._kill.is_set():
            raise Killed
        if self._stop.is_set():
            raise Stopped
        if time.monotonic() > deadline:
            raise NotPlaced(failure)

    def _get(self, refs, deadline: float):
        """ray.get, in slices, so that a kill or a stop is never kept waiting on a rank that is slow to start."""
        import ray

        pending = refs if isinstance(refs, list) else [refs]
        while ray.wait(pending, num_returns=len(pending), timeout=WAIT_SLICE_S)[1]:
            seconds = max(self.placement_timeout, START_MIN_S)
            self._check(deadline, f"the ranks were placed on the Ray cluster but did not start within {seconds:g} s")
        return ray.get(refs)

    def _watch(self, devices: int) -> int:
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        ends: dict[int, RankEnd] = {}
        asked: dict[int, object] = {}  # rank -> its poll call in flight (never dropped: it carries output)
        stop_at = failed_at = None
        shutdown_s = float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT_S))
        while len(ends) < devices:
            if self._kill.is_set():
                return -signal.SIGKILL
            now = time.monotonic()
            if self._stop.is_set() and stop_at is None:
                self._signal_all(signal.SIGTERM, ends)
                stop_at = now
            if (failed_at and now - failed_at > FAILURE_GRACE_S) or (stop_at and now - stop_at > shutdown_s):
                for rank in set(range(devices)) - set(ends):  # the rest of a failed run, or a stop out of time
                    ends[rank] = RankEnd(rank, -signal.SIGKILL, None, now, ended_by_us=True)
                break
            for rank, actor in enumerate(self.actors):
                if rank not in ends and rank not in asked:
                    asked[rank] = actor.poll.remote()
            ready, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=WAIT_SLICE_S)
            for rank, ref in list(asked.items()):
                if ref not in ready:
                    continue  # slow to answer: waited for next round
                del asked[rank]
                try:
                    out, err, code, record = ray.get(ref)
                except ActorUnavailableError:
                    continue  # unreachable for a moment: asked again
                except RayActorError:
                    ends[rank] = RankEnd(rank, None, None, time.monotonic())
                    continue
                self._write("out", out)
                self._write("err", err)
                if code is not None:
                    ends[rank] = RankEnd(rank, code, record, time.monotonic())
            if failed_at is None and any(end.code != 0 for end in ends.values()):
                failed_at = time.monotonic()
            if len(ends) < devices:
                time.sleep(POLL_S)
        code, line = outcome([ends[r] for r in range(devices)], stopped=self._stop.is_set())
        if line:
            self._say(line)
        return code

    def _signal_all(self, sig: int, ends: dict[int, RankEnd]) -> None:
        for rank, actor in enumerate(self.actors):
            if rank not in ends:
                actor.signal.remote(int(sig))

    def _teardown(self) -> None:
        """Every rank's trainer killed, its actor and the placement group gone: nothing of the run left running."""
        import ray

        for actor in self.actors:
            actor.signal.remote(int(signal.SIGKILL))  # the trainer now; its actor's death would also take it
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            with contextlib.suppress(Exception):  # already removed
                ray.util.remove_placement_group(self.group)
        self._wait_gone([f"{self.key}-rank{rank}" for rank in range(len(self.actors))])

    def _wait_gone(self, names: list[str]) -> None:
        import ray

        deadline = time.monotonic() + GONE_TIMEOUT_S
        for name in names:
            while True:
                try:
                    ray.get_actor(name)
                except ValueError:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the Ray actor {name} is still alive {GONE_TIMEOUT_S} s after it was killed")
                time.sleep(0.2)
