"""--report-to against the real things: a local `mlflow server` (SQLite, 127.0.0.1) read back with MlflowClient,
TensorBoard event files read back with tensorboard's EventAccumulator, and a W&B offline run read back with
`wandb leet inspect --json` (wandb's own reader of its .wandb log). Each is compared with metrics.jsonl.

A tracker's test is skipped only when its extra is not installed (the dev extra installs all three).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.settings.config import RunConfig
from finetune.track import base
from finetune.track.base import flatten
from finetune.track.mlflow_tracker import MAX_PARAM_LENGTH

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOY_RUN = ["--max-steps", "3", "--eval-every", "2", "--batch-size", "8", "--max-seq-len", "512"]
OPTIONS = {"mlflow": {"experiment": "trackers-test"}, "wandb": {"project": "trackers-test", "tags": ["toy", "ci"]}}


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


HAS = {
    "tensorboard": _installed("tensorboard"),
    "mlflow": _installed("mlflow"),
    "wandb": _installed("wandb"),
}
HAS_MLFLOW_SERVER = HAS["mlflow"] and _installed("flask", "alembic")  # the server is in `mlflow`, not mlflow-skinny


def needs(tracker: str):
    return pytest.mark.skipif(not HAS[tracker], reason=f"finetune[{tracker}] is not installed")


needs_mlflow_server = pytest.mark.skipif(not HAS_MLFLOW_SERVER, reason="`mlflow server` needs the mlflow package")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with a SQLite backend and served artifacts, in a folder of its own."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        command = [
            str(Path(sys.executable).with_name("mlflow")), "server",
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip
        self.log_path = root / "server.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(deadline=time.monotonic() + 240)  # ~15 s on a quiet machine, a minute under load

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.kill()
        raise RuntimeError("mlflow server did not get ready")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to the server and its workers (its own process group): no goodbye to any client."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    if not HAS_MLFLOW_SERVER:
        yield None
        return
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    yield server
    server.kill()


def _tracker_env(tmp: Path, mlflow_uri: str | None) -> dict[str, str]:
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp / "wandb"),
        "WANDB_DATA_DIR": str(tmp / "wandb-data"),  # wandb's staging and cache: never the user's ~/.local
        "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(tmp / "wandb-config"),
        "WANDB_SILENT": "true",
    }
    (tmp / "wandb").mkdir(parents=True, exist_ok=True)
    if mlflow_uri:
        env["MLFLOW_TRACKING_URI"] = mlflow_uri
    return env


@pytest.fixture(scope="module")
def tracked_run(toy_model, tmp_path_factory, mlflow_server):
    """One toy run (3 steps, validation at steps 2 and 3) reported to every tracker that is installed."""
    tmp = tmp_path_factory.mktemp("tracked")
    trackers = [t for t in ("tensorboard", "mlflow", "wandb") if HAS[t] and (t != "mlflow" or mlflow_server)]
    if not trackers:
        pytest.skip("no tracker is installed")
    options = {t: OPTIONS[t] for t in trackers if t in OPTIONS}
    out = tmp / "run-all"
    with pytest.MonkeyPatch.context() as env:
        for name, value in _tracker_env(tmp, mlflow_server.uri if mlflow_server else None).items():
            env.setenv(name, value)
        args = ["train", str(EXAMPLES / "train.jsonl"), "--model", str(toy_model), "--out", str(out), *TOY_RUN]
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):  # the trackers' threads print nothing there either
            code = main([*args, "--report-to", ",".join(trackers), "--tracker-options", json.dumps(options), "--json"])
    assert code == 0
    assert json.loads(stdout.getvalue())["steps_taken"] == 3, stdout.getvalue()  # --json: stdout is the report only
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and "val_loss" not in rows[0] and "val_loss" in rows[1]
    return {"out": out, "rows": rows, "tmp": tmp, "plan": json.loads((out / "plan.json").read_text())}


def _series(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as name -> [(step, value)], every field but `step`."""
    series: dict[str, list] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step":
                series.setdefault(key, []).append((row["step"], value))
    return series


# ----------------------------------------------------------------------------- MLflow


def _mlflow_run(client, experiment: str, run_name: str):
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id], filter_string=f"attributes.run_name = '{run_name}'")
    assert len(runs) == 1, runs
    return runs[0]


@needs_mlflow_server
def test_mlflow_server_has_the_params_every_metric_and_the_files(tracked_run, mlflow_server, tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    out, rows = tracked_run["out"], tracked_run["rows"]
    run = _mlflow_run(client, "trackers-test", out.name)
    assert run.info.status == "FINISHED"

    # params: the plan with Auto's values, and Auto's reason per choice
    expected = {k: str(v)[:MAX_PARAM_LENGTH] for k, v in flatten(tracked_run["plan"]).items()}
    assert run.data.params == expected
    assert run.data.params["learning_rate"] == str(tracked_run["plan"]["learning_rate"])
    assert run.data.params["auto.learning_rate"] == tracked_run["plan"]["auto"]["learning_rate"]

    # metrics: every field of metrics.jsonl at its step, exactly (val_loss only on its steps)
    series = _series(rows)
    assert set(run.data.metrics) == set(series)
    for key, values in series.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == values, key
    assert [step for step, _ in series["val_loss"]] == [2, 3]

    # artifacts: report.json, loss_curve.png and the model card, byte for byte
    names = {a.path for a in client.list_artifacts(run.info.run_id)} | {
        a.path for a in client.list_artifacts(run.info.run_id, "adapter")
    }
    assert {"report.json", "loss_curve.png", "adapter/README.md"} <= names
    for name in ("report.json", "loss_curve.png", "adapter/README.md"):
        local = client.download_artifacts(run.info.run_id, name, str(tmp_path))
        assert Path(local).read_bytes() == (out / name).read_bytes(), name
    assert run.data.tags["finetune.diagnosis"] == json.loads((out / "report.json").read_text())["diagnosis"]["kind"]


# ----------------------------------------------------------------------------- TensorBoard


def _events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    accumulator.Reload()
    return accumulator


@needs("tensorboard")
def test_tensorboard_events_read_back_equal_to_metrics_jsonl(tracked_run):
    out = tracked_run["out"]
    events = _events(out / "tensorboard")
    series = _series(tracked_run["rows"])
    assert set(events.Tags()["scalars"]) == set(series)
    for key, values in series.items():
        scalars = [(e.step, e.value) for e in events.Scalars(key)]
        assert [s for s, _ in scalars] == [s for s, _ in values], key
        assert [v for _, v in scalars] == pytest.approx([v for _, v in values], rel=1e-6), key  # stored as float32
    curve = events.Images("loss_curve")
    assert len(curve) == 1 and curve[0].encoded_image_string == (out / "loss_curve.png").read_bytes()
    texts = {tag: events.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]}
    assert '"steps_taken": 3' in texts["report/text_summary"]
    assert texts["adapter/README/text_summary"] == (out / "adapter" / "README.md").read_text()
    assert "| auto.learning_rate |" in texts["plan/text_summary"]
    assert events.PluginTagToContent("hparams")  # the plan's settings in the HParams tab


# ----------------------------------------------------------------------------- Weights & Biases


def _wandb_records(run_dir: Path) -> list[dict]:
    """The offline run's .wandb log, read by wandb's own reader (`wandb leet inspect --json`)."""
    answer = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in answer.stdout.splitlines() if line.strip()]


@needs("wandb")
def test_wandb_offline_run_history_matches_metrics_jsonl(tracked_run):
    out, rows = tracked_run["out"], tracked_run["rows"]
    found = sorted((tracked_run["tmp"] / "wandb" / "wandb").glob("offline-run-*"))
    assert len(found) == 1, found
    records = _wandb_records(found[0])

    history = sorted((r["history"]["item"] for r in records if r["type"] == "history"), key=lambda h: h["_step"])
    assert [h["_step"] for h in history] == [r["step"] for r in rows]
    for item, row in zip(history, rows, strict=True):
        assert {k: v for k, v in item.items() if not k.startswith("_")} == {k: v for k, v in row.items() if k != "step"}

    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["display_name"] == out.name and run["project"] == "trackers-test" and run["tags"] == ["toy", "ci"]
    config = run["config"]["update"]
    assert config["learning_rate"] == tracked_run["plan"]["learning_rate"]
    assert config["auto"]["learning_rate"] == tracked_run["plan"]["auto"]["learning_rate"]

    artifact = next(r["artifact"] for r in records if r["type"] == "artifact")
    files = {c["path"]: c["digest"] for c in artifact["manifest"]["contents"]}
    for name in ("report.json", "loss_curve.png", "adapter/README.md"):
        assert files[name] == base64.b64encode(hashlib.md5((out / name).read_bytes()).digest()).decode(), name
    assert next(r["exit"] for r in records if r["type"] == "exit")["exit_code"] == 0


# ----------------------------------------------------------------------------- preference tuning


@needs("tensorboard")
def test_a_dpo_runs_preference_metrics_reach_the_tracker(toy_model, tmp_path):
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join((EXAMPLES / "prefs.jsonl").read_text().splitlines(keepends=True)[:32]))
    out = tmp_path / "dpo"
    args = ["train", str(data), "--model", str(toy_model), "--out", str(out), "--method", "dpo", *TOY_RUN]
    assert main([*args, "--val-fraction", "0.25", "--report-to", "tensorboard"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    series = _series(rows)
    assert {"reward_margin", "reward_accuracy", "chosen_logp", "rejected_logp", "val_reward_margin"} <= set(series)
    events = _events(out / "tensorboard")
    for key, values in series.items():
        assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in events.Scalars(key)] == values, key


# ----------------------------------------------------------------------------- a tracker that dies mid-run


@needs_mlflow_server
def test_an_mlflow_server_killed_mid_run_never_stops_or_holds_the_run(toy_model, tmp_path, monkeypatch, caplog):
    from mlflow import MlflowClient

    from finetune.run import train

    server = MlflowServer(tmp_path / "server")  # its own: the others' server stays up whatever the test order
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    client = MlflowClient(tracking_uri=server.uri)
    out = tmp_path / "run-killed"

    def kill_after_the_first_logged_step(row: dict) -> None:
        if row["step"] != 1:
            return
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the tracker's thread sends step 1; wait until the server has it
            found = client.get_experiment_by_name("finetune")
            runs = client.search_runs([found.experiment_id]) if found else []
            if runs and client.get_metric_history(runs[0].info.run_id, "train_loss"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the server never received step 1")
        server.kill()

    timings = {"log_step": [], "finish": []}
    for name in timings:
        original = getattr(base.Trackers, name)

        def timed(self, *args, _original=original, _name=name, **kwargs):
            started = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                timings[_name].append(time.perf_counter() - started)

        monkeypatch.setattr(base.Trackers, name, timed)

    config = RunConfig(
        data=str(EXAMPLES / "train.jsonl"), model=str(toy_model), out=str(out), max_steps=3, eval_every=2,
        batch_size=8, max_seq_len=512, report_to="mlflow",
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="finetune"):
        result = train(config, on_step=kill_after_the_first_logged_step)

    assert not server.alive()
    assert result.report["steps_taken"] == 3 and (out / "report.json").is_file() and (out / "adapter").is_dir()
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "finetune" and "--report-to mlflow" in r.getMessage()
    ]
    assert len(warnings) == 1 and "training goes on without mlflow" in warnings[0], warnings
    assert max(timings["log_step"]) < 0.1  # each step only hands its row over
    assert timings["finish"][0] < base.FINISH_TIMEOUT_S  # the dead server holds the run's end for no longer


# ----------------------------------------------------------------------------- a W&B server that is down

DEAD_WANDB_RUN = """
import logging, time
from finetune.track.base import Trackers
logging.basicConfig(level=logging.WARNING, format="%(message)s")
trackers = Trackers.named("wandb")
trackers.start({"out": OUT, "report_to": "wandb", "tracker_options": None, "resume": False}, {"total_steps": 2})
for step in (1, 2):
    trackers.log_step({"step": step, "train_loss": 1.0 / step})
trackers.finish(OUT, {})
"""


@needs("wandb")
def test_a_wandb_server_that_is_down_is_one_warning_and_never_holds_the_process(tmp_path):
    """W&B's own process retries for minutes and the interpreter's exit waits for it: the caps keep it short."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= _tracker_env(tmp_path, None) | {"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{_free_port()}"}
    env["WANDB_API_KEY"] = "k" * 40
    (tmp_path / "out").mkdir()
    started = time.monotonic()
    answer = subprocess.run(
        [sys.executable, "-c", f"OUT = {str(tmp_path / 'out')!r}\n" + DEAD_WANDB_RUN],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    took = time.monotonic() - started
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout == ""  # W&B's notes go to stderr, if anywhere
    warnings = [line for line in answer.stderr.splitlines() if line.startswith("--report-to wandb")]
    assert len(warnings) == 1 and "training goes on without wandb" in warnings[0], answer.stderr
    assert took < 60, f"the process took {took:.0f} s to end"  # about 10 s under load; W&B's defaults: minutes
