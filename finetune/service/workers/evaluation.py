"""A worker runs the evaluations callers start (POST /v1/fine_tuning/jobs/{id}/evaluations, the dashboard's Evaluate
button): `python -m finetune eval RUN [--retention [--retention-only]]` as a child process, like a trainer. The API
process never loads a model; neither does the worker: its child does, and writes retention.json / eval.json into the
run folder, where the dashboard reads them and which deleting the training file removes (storage/deletion.py).

    runner = EvaluationRunner(options, store, worker_name, program, stopping)
    runner.run_once()      # claims the oldest waiting evaluation (a lease, renewed every heartbeat) and runs it

The evaluation's `results` keep numbers only: the retention check's summary (retention.py `summary`: rates,
intervals, KL, the flag, its message and remedies, no prompt or answer) and the test set's scores per model. The
answers stay in the run folder's eval.json (`answers_sha256` names the version these numbers came with). The child
writes its messages in the API caller's terms (wording.py AUDIENCE_ENV); its stdout (which quotes answers) is not
kept, its stderr goes to logs/<job id>-eval-<evaluation id>.log, which goes with the job.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.service.options import ServiceOptions
from finetune.service.storage import bucket_copy
from finetune.service.storage.evaluations import EvaluationClaim, Evaluations
from finetune.service.storage.job_names import method_type
from finetune.service.storage.store import Store
from finetune.service.workers.events import trainer_error
from finetune.settings.errors import ERROR_FILE_ENV
from finetune.settings.wording import AUDIENCE_ENV
from finetune.ship.eval.progress import PROGRESS_FILE_ENV, read_new
from finetune.ship.eval.retention import RETENTION_FILE, summary
from finetune.train.trainer_run import die_with_parent

EVAL_FILE = "eval.json"
TEST_FILE = "test.jsonl"  # the run's held-out test split (ship/eval/test_split.py)
EVAL_OUTPUTS = (EVAL_FILE, "eval.html", RETENTION_FILE)  # what `finetune eval RUN` writes into the run folder
# eval.json's numbers (its `rows`, `best`, `worst` quote prompts and answers; `test_file`, `models` are server paths)
TEST_NUMBERS = ("examples", "summary", "grounding", "win_rate", "val_loss", "steps", "ranked_by")


class EvaluationRunner:
    def __init__(
        self,
        options: ServiceOptions,
        store: Store,
        name: str,
        program: list[str] | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        self.options, self.name = options, name
        self.evaluations = Evaluations(store.engine)
        self.program = list(program or [sys.executable, "-m", "finetune"])  # a worker's launcher's (tests: a stand-in)
        self.stopping = stopping or threading.Event()

    def run_once(self) -> bool:
        """Run one waiting evaluation to its end; False when none waits."""
        claim = self.evaluations.claim(self.name, self.options.lease_seconds)
        if claim is None:
            return False
        try:
            self._run(claim)
        except Exception as exc:  # a bug must not take the worker down; the evaluation says it failed
            error = {"code": "internal_error", "message": f"the worker failed unexpectedly ({type(exc).__name__})"}
            self.evaluations.finish(claim.evaluation["id"], claim.token, "failed", error=error | {"param": None})
        return True

    def command(self, evaluation: dict, run: Path) -> list[str]:
        args = ["eval", str(run)]
        if evaluation["retention"]:
            args += ["--retention"] + ([] if evaluation["test"] else ["--retention-only"])
        return [*self.program, *args]

    def _run(self, claim: EvaluationClaim) -> None:
        evaluation, job, token = claim.evaluation, claim.job, claim.token
        run = bucket_copy.pull_run(self.options, job["id"])  # --storage: the run, its weights and test split here
        bucket_copy.pull_weights(self.options, job["id"])
        bucket_copy.pull(self.options, run / TEST_FILE)
        log = self.options.logs_dir / f"{job['id']}-eval-{evaluation['id']}.log"
        progress = log.with_suffix(".progress.jsonl")  # the child's estimate and a line per batch: the job's events
        env = {ERROR_FILE_ENV: str(log.with_suffix(".error.json")), AUDIENCE_ENV: f"api:{method_type(job)}",
               PROGRESS_FILE_ENV: str(progress)}  # fmt: skip
        began = time.time()
        with open(log, "ab") as stderr:
            child = subprocess.Popen(
                self.command(evaluation, run),
                env={**os.environ, **env},
                stdout=subprocess.DEVNULL,  # it prints answers: they stay in the run folder's files only
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
                start_new_session=True,
            )
        code = self._wait(child, evaluation["id"], token, Progress(progress, job["id"], run, self.options.data_dir))
        if code is None:  # the lease went to another worker, or this worker is stopping: nothing more to write
            return
        if code != 0:
            message = _scrubbed(trainer_error(log, method_type(job)), run, job["id"], self.options.data_dir)
            error = {"code": "evaluation_failed", "message": message, "param": None}
            self.evaluations.finish(evaluation["id"], token, "failed", error=error)
            return
        results, missing = evaluation_results(run, evaluation, began)
        if missing:
            error = {"code": "evaluation_failed", "message": f"the evaluation wrote no {missing}", "param": None}
            self.evaluations.finish(evaluation["id"], token, "failed", error=error)
            return
        results = _scrubbed(results, run, job["id"], self.options.data_dir)
        bucket_copy.push(self.options, *[p for p in (run / n for n in EVAL_OUTPUTS) if p.is_file()])  # --storage
        self.evaluations.finish(evaluation["id"], token, "succeeded", results=results)

    def _wait(self, child: subprocess.Popen, eval_id: str, token: str, progress: Progress) -> int | None:
        """The child's exit code, renewing the lease each heartbeat (and adding its new progress lines to the job's
        events); None (the child killed) when the lease is lost or this worker stops (the evaluation then waits for
        the next worker, from the start)."""
        try:
            while True:
                try:
                    code = child.wait(timeout=self.options.heartbeat_seconds)
                    self.evaluations.heartbeat(eval_id, token, self.options.lease_seconds, progress.new())
                    progress.path.unlink(missing_ok=True)
                    return code
                except subprocess.TimeoutExpired:
                    pass
                if self.stopping.is_set():
                    child.kill()
                    child.wait()
                    self.evaluations.requeue(eval_id, token)
                    return None
                if not self.evaluations.heartbeat(eval_id, token, self.options.lease_seconds, progress.new()):
                    child.kill()
                    child.wait()
                    return None
        except BaseException:  # this worker failing: no child may write on
            child.kill()
            raise


@dataclass
class Progress:
    """The progress file an evaluation's child appends to (ship/eval/progress.py), read as it grows."""

    path: Path
    job_id: str
    run: Path
    data_dir: Path
    offset: int = 0

    def new(self) -> tuple[str, list[dict]]:
        """(the job, the lines added since the last call as events, no server path in them)."""
        found, self.offset = read_new(self.path, self.offset)
        return self.job_id, [_scrubbed(event, self.run, self.job_id, self.data_dir) for event in found]


def evaluation_results(run: Path, evaluation: dict, since: float) -> tuple[dict, str | None]:
    """(the numbers of what the command wrote for this evaluation, the file missing or None). A file older than
    `since` is an earlier evaluation's: missing."""
    results: dict[str, Any] = {}
    if evaluation["retention"]:
        report = _fresh_json(run / RETENTION_FILE, since)
        if report is None:
            return {}, RETENTION_FILE
        results["retention"] = summary(report)
    if evaluation["test"]:
        path = run / EVAL_FILE
        found = _fresh_json(path, since)
        if found is None:
            return {}, EVAL_FILE
        results["test"] = {k: found[k] for k in TEST_NUMBERS if k in found}
        results["test"]["answers_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return results, None


def _fresh_json(path: Path, since: float) -> dict | None:
    try:
        if path.stat().st_mtime < since - 1:  # a second's slack: some filesystems keep whole seconds
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _scrubbed(value: Any, run: Path, job_id: str, data_dir: Path) -> Any:
    """No path on the server in what a caller reads: the run folder is the job, the rest of the data folder a name."""
    if isinstance(value, dict):
        return {k: _scrubbed(v, run, job_id, data_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, run, job_id, data_dir) for v in value]
    if not isinstance(value, str):
        return value
    for path, name in ((run, job_id), (data_dir, "<data folder>")):
        for form in (str(path.resolve()), str(path)):
            value = value.replace(form, name)
    return value
