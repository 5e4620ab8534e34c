"""One rank of a Ray run, on the node Ray placed it on: a Ray actor that starts the project's own trainer,
`python -m finetune train --plan PLAN --out OUT [--resume]`, as its child and hands its output to the launcher.

The child dies with the actor (PR_SET_PDEATHSIG): an actor killed by Ray, by a signal or with its node never
leaves a trainer writing on. Its rank failure record (distributed.record_failure, the torchelastic error file
format) is read back for the launcher, which names the rank that failed first (ray_launch.outcome).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

from finetune.train.trainer_run import die_with_parent

READER_JOIN_S = 10  # after the trainer exits, time its pipes get to drain


class RankProcess:
    """A Ray actor class (ray_launch wraps it with ray.remote): one rank's trainer process."""

    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.folder = tempfile.mkdtemp(prefix="finetune-rank-")  # its error file
        self.buffers = {"out": bytearray(), "err": bytearray()}
        self.lock = threading.Lock()
        self.readers: list[threading.Thread] = []

    def where(self) -> dict:
        """This actor's node and process, for the placement line and for the tests."""
        import ray

        return {
            "ip": ray.util.get_node_ip_address(),
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
        }

    def free_port(self) -> int:
        """A port nobody listens on on this node: rank 0's process group store (MASTER_PORT), as torchrun picks one."""
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(self, args: list[str], env: dict[str, str], cwd: str | None) -> int:
        """Start the trainer with `finetune <args>`; its pid."""
        error_file = os.path.join(self.folder, "error.json")
        self.child = subprocess.Popen(
            [sys.executable, "-u", "-m", "finetune", *args],
            env={**os.environ, **env, "TORCHELASTIC_ERROR_FILE": error_file},
            cwd=cwd if cwd and os.path.isdir(cwd) else None,  # relative paths work where the node has that folder
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            start_new_session=True,
        )
        for name, pipe in (("out", self.child.stdout), ("err", self.child.stderr)):
            reader = threading.Thread(target=self._read, args=(name, pipe), daemon=True)
            reader.start()
            self.readers.append(reader)
        return self.child.pid

    def _read(self, name: str, pipe) -> None:
        while chunk := pipe.read1(65536):
            with self.lock:
                self.buffers[name] += chunk

    def poll(self) -> tuple[bytes, bytes, int | None, dict | None]:
        """(new stdout lines, new stderr lines, the exit code or None while it runs, its failure record or None).
        Only whole lines are handed over until the end, so ranks' lines never interleave mid-line."""
        code = self.child.poll() if self.child else None
        if code is not None:
            for reader in self.readers:
                reader.join(READER_JOIN_S)
        with self.lock:
            taken = []
            for name in ("out", "err"):
                buffer = self.buffers[name]
                cut = len(buffer) if code is not None else buffer.rfind(b"\n") + 1
                taken.append(bytes(buffer[:cut]))
                del buffer[:cut]
        return taken[0], taken[1], code, self._record() if code is not None else None

    def _record(self) -> dict | None:
        """The failure record the trainer wrote, if any (read once: the folder goes with it)."""
        try:
            with open(os.path.join(self.folder, "error.json"), encoding="utf-8") as f:
                return json.load(f).get("finetune")
        except (OSError, ValueError, AttributeError):
            return None
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def signal(self, sig: int) -> None:
        if self.child is not None and self.child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(sig)
