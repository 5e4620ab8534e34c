"""The official openai SDK against a real `finetune serve` (one real worker, the toy model) on loopback."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from openai import OpenAI
from service_helpers import EXAMPLES, Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared export generator
from long_export import HUGE_REPLY_LINE, LONG_LINES, write_support_export  # noqa: E402

TERMINAL = {"succeeded", "failed", "cancelled"}
SMALL = {"n_epochs": 1, "batch_size": 4, "max_seq_len": 256, "val_fraction": 0.25, "eval_every": 1, "save_every": 1}
LONGER = SMALL | {"n_epochs": 2, "val_fraction": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, toy_model):
    s = Server(tmp_path_factory.mktemp("svc") / "data", toy_model, workers=1,
               extra=("--max-upload-bytes", "200000", "--heartbeat-seconds", "0.5"))  # fmt: skip
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    assert server.key, server.output()
    return OpenAI(base_url=server.url, api_key=server.key, max_retries=0)


@pytest.fixture(scope="module")
def jobs(client, tiny_data) -> dict:
    """Three jobs queued at once: the worker takes them in order while the other tests run."""
    f = client.files.create(file=("tiny.jsonl", tiny_data.read_bytes()), purpose="fine-tune")
    method = {"type": "supervised", "supervised": {"hyperparameters": SMALL}}
    done = client.fine_tuning.jobs.create(model="toy", training_file=f.id, suffix="demo", seed=7,
                                          metadata={"team": "research"}, method=method)  # fmt: skip
    # the deprecated top-level hyperparameters still work
    cancelled = client.fine_tuning.jobs.create(
        model="toy", training_file=f.id, seed=7, hyperparameters={"n_epochs": 2, "batch_size": 2}
    )
    paused = client.fine_tuning.jobs.create(
        model="toy",
        training_file=f.id,
        seed=7,
        method={"type": "supervised", "supervised": {"hyperparameters": LONGER}},
    )
    return {"file": f, "done": done, "cancelled": cancelled, "paused": paused}


def _wait(client, job_id: str, until, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if until(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} stuck at {job.status}: {job}")


def test_a_job_runs_to_succeeded_with_events_checkpoints_and_results(client, jobs):
    cancelled = client.fine_tuning.jobs.cancel(jobs["cancelled"].id)  # still waiting behind the first job
    assert cancelled.status == "cancelled"
    assert cancelled.hyperparameters.n_epochs == 2 and cancelled.hyperparameters.batch_size == 2
    assert cancelled.hyperparameters.learning_rate_multiplier == "auto"
    with pytest.raises(openai.BadRequestError):  # an illegal transition is 400, never 409 (the SDK retries 409)
        client.fine_tuning.jobs.cancel(jobs["cancelled"].id)

    job = _wait(client, jobs["done"].id, lambda j: j.status in TERMINAL)
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model == f"ft:toy:default:demo:{job.id}"
    assert job.hyperparameters.n_epochs == 1 and job.hyperparameters.batch_size == 4
    assert job.metadata == {"team": "research"} and job.attempts == 1

    events = list(client.fine_tuning.jobs.list_events(job.id, limit=2))  # the SDK pages with after=<last id>
    numbers = [int(e.id.split("-")[1]) for e in events]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
    everything = client.fine_tuning.jobs.list_events(job.id, limit=100).data
    assert [e.id for e in everything] == [e.id for e in events]  # no gaps, no repeats
    assert client.fine_tuning.jobs.list_events(job.id, after=events[-1].id).data == []
    plan = next(e for e in events if e.message.startswith("Planned"))
    metrics = [e for e in events if e.type == "metrics"]
    assert len(metrics) == plan.data["total_steps"]  # evaluated and saved every step
    assert all(e.data["valid_loss"] is not None and e.data["train_loss"] > 0 for e in metrics)
    assert sum(e.message == "The job has successfully completed" for e in events) == 1
    assert job.trained_tokens == plan.data["tokens_processed"]

    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id, limit=1))
    assert len(checkpoints) >= 2 and checkpoints[0].step_number == plan.data["total_steps"]
    assert checkpoints[0].fine_tuned_model_checkpoint == f"{job.fine_tuned_model}:ckpt-step-{plan.data['total_steps']}"
    assert checkpoints[0].metrics.train_loss > 0

    csv = client.files.content(job.result_files[0]).text.splitlines()
    assert csv[0] == "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy"
    assert len(csv) == 1 + plan.data["total_steps"] and csv[1].startswith("1,")

    assert job.fine_tuned_model in [m.id for m in client.models.list()]
    usage = client.get("/usage", cast_to=object)
    assert usage["total_trained_tokens"] >= job.trained_tokens
    metrics_rows = client.get(f"/fine_tuning/jobs/{job.id}/metrics", cast_to=object)["data"]
    assert [r["step"] for r in metrics_rows] == list(range(1, plan.data["total_steps"] + 1))


def test_pause_then_resume_finishes_from_the_checkpoint(client, jobs):
    job_id = jobs["paused"].id
    _wait(client, job_id, lambda j: j.status == "running")
    deadline = time.monotonic() + 240
    while not client.fine_tuning.jobs.checkpoints.list(job_id).data and time.monotonic() < deadline:
        time.sleep(0.3)
    assert client.fine_tuning.jobs.pause(job_id).status == "paused"
    # the trainer checkpoints and stops at its step boundary; the job stays paused until resumed
    time.sleep(2)
    assert client.fine_tuning.jobs.retrieve(job_id).status == "paused"
    assert client.fine_tuning.jobs.resume(job_id).status == "queued"
    job = _wait(client, job_id, lambda j: j.status in TERMINAL)
    assert job.status == "succeeded", job.error
    assert job.attempts == 2
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=100)]
    assert any(m.startswith("Resuming from step") for m in messages)
    steps = [r["step"] for r in client.get(f"/fine_tuning/jobs/{job_id}/metrics", cast_to=object)["data"]]
    assert steps == list(range(1, job.hyperparameters.total_steps + 1))


def test_bad_file_fails_at_validation_naming_the_line(client, jobs):
    bad = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n{oops\n'
    f = client.files.create(file=("bad.jsonl", io.BytesIO(bad)), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(model="toy", training_file=f.id)
    job = _wait(client, job.id, lambda j: j.status in TERMINAL)
    assert job.status == "failed" and job.error.code == "invalid_training_file"
    assert job.error.param == "training_file" and "line 2" in job.error.message and "bad.jsonl" in job.error.message
    assert "/" not in job.error.message  # no server path


def test_tenants_are_isolated(server, client, jobs):
    made = subprocess.run([sys.executable, "-m", "finetune", "keys", "create", "--tenant", "other",
                           "--data-dir", str(server.data_dir)], capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0, made.stderr
    other_key = made.stdout.split()[-1]
    other = OpenAI(base_url=server.url, api_key=other_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.retrieve(jobs["done"].id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(jobs["file"].id)
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.list_events(jobs["done"].id)
    with pytest.raises(openai.NotFoundError):
        other.fine_tuning.jobs.cancel(jobs["paused"].id)
    with pytest.raises(openai.BadRequestError):  # a job cannot name another tenant's file
        other.fine_tuning.jobs.create(model="toy", training_file=jobs["file"].id)
    assert other.fine_tuning.jobs.list().data == [] and other.files.list().data == []
    assert [m.owned_by for m in other.models.list()] == ["finetune"]
    # the key never lands anywhere on the server's side: log, database, files
    assert other_key not in server.output()
    for path in server.data_dir.rglob("*"):
        if path.is_file():
            assert other_key.encode() not in path.read_bytes(), path


def test_no_key_or_a_wrong_key_is_401(server):
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=server.url, api_key="ftk-000000000000-wrong", max_retries=0).models.list()
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"{server.url}/fine_tuning/jobs")
    assert raised.value.code == 401 and raised.value.headers["content-type"] == "application/json"
    assert json.loads(raised.value.read())["error"]["code"] == "invalid_api_key"
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/healthz") as answer:
        assert answer.status == 200
    # the dashboard's cookie is the other way in, through the same dependency
    by_cookie = urllib.request.Request(f"{server.url}/models", headers={"Cookie": f"finetune_key={server.key}"})
    with urllib.request.urlopen(by_cookie) as answer:
        assert answer.status == 200 and json.loads(answer.read())["object"] == "list"


def test_upload_over_the_limit_is_413_and_leaves_nothing(server, client):
    before = set((server.data_dir / "files").iterdir())
    with pytest.raises(openai.APIStatusError) as raised:
        client.files.create(file=("big.jsonl", b"x" * 300_000), purpose="fine-tune")
    assert raised.value.status_code == 413
    assert set((server.data_dir / "files").iterdir()) == before
    assert list((server.data_dir / "uploads").iterdir()) == []


def test_plan_route_and_job_paging(client, jobs):
    body = {"model": "toy", "training_file": jobs["file"].id,
            "method": {"type": "supervised", "supervised": {"hyperparameters": SMALL}}}  # fmt: skip
    plan = client.post("/fine_tuning/plan", body=body, cast_to=object)
    assert plan["object"] == "fine_tuning.plan" and plan["epochs"] == 1 and plan["total_steps"] >= 1
    deprecated = {"model": "toy", "training_file": jobs["file"].id, "hyperparameters": {"n_epochs": 3, "batch_size": 4}}
    assert client.post("/fine_tuning/plan", body=deprecated, cast_to=object)["epochs"] == 3
    with pytest.raises(openai.BadRequestError) as raised:
        client.post("/fine_tuning/plan", body=body | {"model": "/etc/passwd"}, cast_to=object)
    assert raised.value.code == "model_not_available" and raised.value.param == "model"
    no_step = {"type": "supervised", "supervised": {"hyperparameters": {"grad_accum": 4096, "last_batch": "drop"}}}
    with pytest.raises(openai.BadRequestError) as raised:  # settings that cannot work: not the file's fault
        client.post("/fine_tuning/plan", body=body | {"method": no_step}, cast_to=object)
    assert raised.value.code == "invalid_hyperparameters" and "no step would be taken" in raised.value.message
    too_long = {"type": "supervised", "supervised": {"hyperparameters": {"max_seq_len": 8, "truncation": "drop"}}}
    with pytest.raises(openai.BadRequestError) as raised:  # every record over the context: the file's problem
        client.post("/fine_tuning/plan", body=body | {"method": too_long}, cast_to=object)
    assert raised.value.code == "invalid_training_file" and raised.value.param == "training_file"
    with pytest.raises(openai.BadRequestError) as raised:
        bad = {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 0}}}
        client.fine_tuning.jobs.create(model="toy", training_file=jobs["file"].id, method=bad)
    assert raised.value.param == "hyperparameters.n_epochs"

    seen, page = [], client.fine_tuning.jobs.list(limit=1)
    while True:
        seen += [j.id for j in page.data]
        if not page.has_next_page():
            break
        page = page.get_next_page()
    assert seen == [j.id for j in client.fine_tuning.jobs.list(limit=100).data]
    assert jobs["done"].id in seen and len(seen) >= 3
    tagged = client.fine_tuning.jobs.list(metadata={"team": "research"}).data
    assert [j.id for j in tagged] == [jobs["done"].id]


def test_a_preference_job_runs_to_succeeded(client):
    """Issue 15 in the job service: method type "dpo" with its beta, on the bundled preference pairs."""
    pairs = (EXAMPLES / "prefs.jsonl").read_text().splitlines()[:16]
    f = client.files.create(file=("prefs.jsonl", ("\n".join(pairs) + "\n").encode()), purpose="fine-tune")
    hyper = SMALL | {"beta": 0.2, "method": "lora"}
    method = {"type": "dpo", "dpo": {"hyperparameters": hyper}}
    job = client.fine_tuning.jobs.create(model="toy", training_file=f.id, suffix="prefs", seed=3, method=method)
    assert job.method.type == "dpo" and job.method.dpo.hyperparameters.beta == 0.2

    # a supervised job cannot carry DPO's settings, and a preference job must be lora or full underneath
    with pytest.raises(openai.BadRequestError) as raised:
        client.fine_tuning.jobs.create(model="toy", training_file=f.id,
                                       method={"type": "supervised", "supervised": {"hyperparameters": {"beta": 1}}})  # fmt: skip
    assert raised.value.param == "hyperparameters.beta"
    with pytest.raises(openai.BadRequestError) as raised:
        client.fine_tuning.jobs.create(model="toy", training_file=f.id,
                                       method={"type": "dpo", "dpo": {"hyperparameters": {"method": "dpo"}}})  # fmt: skip
    assert raised.value.param == "hyperparameters.method"

    # a pair whose answers are the same fails validation, naming its line
    bad_pair = json.loads(pairs[0])
    bad_pair["non_preferred_output"] = bad_pair["preferred_output"]
    bad = client.files.create(file=("bad-prefs.jsonl", ("\n".join([pairs[1], json.dumps(bad_pair)]) + "\n").encode()),
                              purpose="fine-tune")  # fmt: skip
    failed = client.fine_tuning.jobs.create(model="toy", training_file=bad.id, method={"type": "dpo"})

    job = _wait(client, job.id, lambda j: j.status in TERMINAL)
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model == f"ft:toy:default:prefs:{job.id}"
    assert job.method.type == "dpo" and job.hyperparameters.beta == 0.2 and job.hyperparameters.method == "lora"
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    plan = next(e for e in events if e.message.startswith("Planned"))
    assert job.trained_tokens == plan.data["tokens_processed"]
    metrics = [e for e in events if e.type == "metrics"]
    assert len(metrics) == plan.data["total_steps"] and all("reward_accuracy" in e.data for e in metrics)
    csv = client.files.content(job.result_files[0]).text.splitlines()
    assert csv[0] == "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy"
    assert len(csv) == 1 + plan.data["total_steps"]
    assert job.fine_tuned_model in [m.id for m in client.models.list()]

    failed = _wait(client, failed.id, lambda j: j.status in TERMINAL)
    assert failed.status == "failed" and failed.error.code == "invalid_training_file"
    assert "line 2" in failed.error.message and "identical_chosen_and_rejected" in failed.error.message


def test_files_and_models_routes(client):
    content = (EXAMPLES / "train.jsonl").read_bytes()[:4000]
    f = client.files.create(file=("some.jsonl", content), purpose="fine-tune")
    assert f.status == "processed" and f.bytes == len(content) and f.filename == "some.jsonl"
    assert client.files.retrieve(f.id).id == f.id
    assert client.files.content(f.id).read() == content
    assert f.id in [x.id for x in client.files.list().data]
    assert client.files.delete(f.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
    assert f.id not in [x.id for x in client.files.list().data]
    with pytest.raises(openai.BadRequestError) as raised:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="not-a-purpose")
    assert raised.value.param == "purpose"

    assert client.models.retrieve("toy").owned_by == "finetune"
    tuned = [m.id for m in client.models.list() if m.id.startswith("ft:")]
    for name in tuned:  # the colons of a fine-tuned model's name travel in the path
        assert client.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_a_long_export_trains_and_its_events_say_what_was_split_and_dropped(client, tmp_path, toy_model):
    """Issue 26 with the official SDK: 40 support conversations, two longer than the model's window and one reply
    longer than it by itself, no length setting: the job splits, drops one record, succeeds, and its events give
    the summary `finetune validate` gives for the same bytes. With `strict` the same file fails, naming lines."""
    from finetune.data.tokenize import load_tokenizer
    from finetune.data.validate import validate_file
    from finetune.settings.config import RunConfig
    from finetune.settings.wording import render

    export = write_support_export(tmp_path / "support.jsonl")
    f = client.files.create(file=("support.jsonl", export.read_bytes()), purpose="fine-tune")
    hyper = {"n_epochs": 1, "batch_size": 2, "max_steps": 1, "val_fraction": 0}
    method = {"type": "supervised", "supervised": {"hyperparameters": hyper}}
    job = client.fine_tuning.jobs.create(model="toy", training_file=f.id, method=method)
    strict = {"type": "supervised", "supervised": {"hyperparameters": hyper | {"strict": True}}}
    refused = client.fine_tuning.jobs.create(model="toy", training_file=f.id, method=strict)

    job = _wait(client, job.id, lambda j: j.status in TERMINAL, timeout=480)
    assert job.status == "succeeded", job.error
    events = [e.message for e in client.fine_tuning.jobs.list_events(job.id, limit=100)]
    validated = validate_file(str(export), load_tokenizer(str(toy_model)), config=RunConfig(model=str(toy_model)))
    expected = [f"[{p.code}] {render(p.message, 'api')}" for p in validated.warnings if p.line is None]  # API terms
    assert [e.split("]")[0] + "]" for e in expected] == ["[conversations_split]", "[dropped_examples]"]
    assert all(message in events for message in expected), (expected, events)
    # lines named as uploaded, never by the stored upload's id (issue 35)
    assert f"support.jsonl:{LONG_LINES[0]}" in expected[0] and f"support.jsonl:{HUGE_REPLY_LINE}" in expected[1]
    assert not any(f"{f.id}:" in event for event in events)
    assert "/" not in " ".join(expected)  # no server path

    refused = _wait(client, refused.id, lambda j: j.status in TERMINAL, timeout=480)
    assert refused.status == "failed" and refused.error.code == "invalid_training_file"
    assert refused.error.param == "training_file" and "support.jsonl" in refused.error.message
    assert all(f"line {line} [too_long]" in refused.error.message for line in (*LONG_LINES, HUGE_REPLY_LINE))
