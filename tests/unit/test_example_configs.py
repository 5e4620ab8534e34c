"""The ready run configurations in examples/configs/ plan as written: each YAML file through RunConfig (the reader
of `finetune train --config`) and the plan a run starts with, the job body through the service's own request model
and POST /v1/fine_tuning/plan. Nothing is trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.run import plan_run
from finetune.service.api.protocol import JobCreate, parse_body
from finetune.settings.config import RunConfig

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "examples" / "configs").glob("*.yaml"))
JOB_BODIES = sorted((REPO / "examples" / "configs").glob("*.json"))
# Planning generates no replay rows and no forgetting curve here: on a real base both have the base model answer
# hundreds of general prompts (minutes on a CPU), and tests/integration covers them; the example's own keys are
# what is checked.
FAST = {"replay": "off", "general_val": False}


def test_there_is_an_example_of_each_kind():
    methods = {RunConfig.from_yaml(path).method for path in CONFIGS}
    assert methods == {"lora", "full", "dpo"}
    assert JOB_BODIES


def _plan(path: Path, **overrides):
    config = RunConfig.from_yaml(path, **overrides)
    return config, plan_run(config, measure=False).plan


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_plans_on_the_toy_model(path, toy_model, monkeypatch):
    monkeypatch.chdir(REPO)  # the examples name their data relative to the repository's root
    config, plan = _plan(path, model=str(toy_model), **FAST)
    assert plan.total_steps > 0
    assert plan.objective == ("dpo" if config.method == "dpo" else "sft")


@pytest.mark.real_model
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_plans_on_the_real_base_it_names(path, smollm2, monkeypatch):
    monkeypatch.chdir(REPO)
    config, plan = _plan(path, **FAST)
    assert config.model == "smollm2-135m-instruct"  # the base the fixture pulled: found by its name
    assert plan.total_steps > 0


@pytest.mark.parametrize("path", JOB_BODIES, ids=lambda p: p.name)
def test_example_job_body_plans_through_the_service(path, toy_model, tmp_path):
    from fastapi.testclient import TestClient

    from finetune.service.dashboard.app import create_app
    from finetune.service.options import ServiceOptions

    body = json.loads(path.read_text(encoding="utf-8"))
    parse_body(JobCreate, body)  # what POST /v1/fine_tuning/jobs reads it with
    app = create_app(ServiceOptions(data_dir=tmp_path / "service", models={body["model"]: str(toy_model)}))
    try:
        client = TestClient(app, base_url="http://127.0.0.1")
        client.headers["Authorization"] = f"Bearer {app.state.store.create_key('docs')[1]}"
        data = (REPO / "examples" / "train.jsonl").read_bytes()
        upload = client.post("/v1/files", data={"purpose": "fine-tune"}, files={"file": ("train.jsonl", data)})
        assert upload.status_code == 200, upload.text
        answer = client.post("/v1/fine_tuning/plan", json=body | {"training_file": upload.json()["id"]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["total_steps"] > 0
    finally:
        app.state.store.close()
