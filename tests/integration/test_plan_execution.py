"""A plan is made once and executed as it is: `finetune plan --json` then `finetune train --plan`, the way the service's
worker plans a job and its trainer executes it; a plan whose data or code changed since is refused in one line.
Planning does each thing once: the model's facts are read once, and Auto's record length is chosen once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from finetune.plan.plan import Plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = ["--epochs", "1", "--batch-size", "8", "--max-steps", "3", "--eval-every", "2", "--val-fraction", "0.1"]


def _finetune(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "finetune", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "train.jsonl"
    shutil.copy(EXAMPLES / "train.jsonl", data)
    return data


def test_a_plan_made_by_finetune_plan_is_the_plan_train_executes(toy_model, tmp_path):
    data = _data(tmp_path)
    made = _finetune("plan", str(data), "--model", str(toy_model), *SMALL, "--json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    (tmp_path / "plan.json").write_text(made.stdout)
    planned = json.loads(made.stdout)

    done = _finetune("train", "--plan", "plan.json", "--out", "run", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    executed = json.loads((tmp_path / "run" / "plan.json").read_text())
    for key in ("total_steps", "learning_rate", "effective_batch", "tokens_processed", "lora_rank", "data_sha256"):
        assert executed[key] == planned[key], key
    report = json.loads(done.stdout)
    assert report["steps_taken"] == planned["total_steps"] == 3 and report["tokens_match"] is True


def test_a_plan_of_other_data_or_other_code_is_refused_in_one_line(toy_model, tmp_path):
    data = _data(tmp_path)
    made = _finetune("plan", str(data), "--model", str(toy_model), *SMALL, "--json", cwd=tmp_path)
    plan = json.loads(made.stdout)

    (tmp_path / "stale-code.json").write_text(json.dumps(plan | {"code_version": "0.0.1+000000000000"}))
    refused = _finetune("train", "--plan", "stale-code.json", "--out", "run-a", cwd=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "was made by finetune 0.0.1+000000000000" in refused.stderr and "plan again" in refused.stderr

    (tmp_path / "plan.json").write_text(made.stdout)
    data.write_text(data.read_text().replace("Hi there", "Hello there", 1))  # same lines, other bytes
    refused = _finetune("train", "--plan", "plan.json", "--out", "run-b", cwd=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "the training file changed since the plan was made" in refused.stderr
    assert not (tmp_path / "run-b" / "checkpoints").exists()

    mixed = _finetune("train", "--plan", "plan.json", "--out", "run-c", "--epochs", "2", cwd=tmp_path)
    assert mixed.returncode == 1 and "--plan holds every setting of the run: drop --epochs" in mixed.stderr


def test_plan_json_reads_back_as_the_same_plan(toy_model, tmp_path):
    from finetune.run import plan_run
    from finetune.settings.config import RunConfig

    plan = plan_run(RunConfig(data=str(_data(tmp_path)), model=str(toy_model), epochs=1, val_fraction=0.1)).plan
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.to_dict() == plan.to_dict()
    assert again.run == plan.run and again.total_steps == plan.total_steps


def test_planning_reads_the_model_facts_once_and_chooses_the_record_length_once(toy_model, tmp_path, monkeypatch):
    import finetune.data.seq_len as seq_len
    import finetune.plan.build as build
    import finetune.run as run
    from finetune.settings.config import RunConfig

    counted = {"facts": 0, "choices": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            counted[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(run, "load_model_facts", counting("facts", run.load_model_facts))
    monkeypatch.setattr(seq_len, "load_model_facts", counting("facts", seq_len.load_model_facts))
    monkeypatch.setattr(seq_len, "auto_max_seq_len", counting("choices", seq_len.auto_max_seq_len))
    monkeypatch.setattr(build, "auto_max_seq_len", counting("choices", build.auto_max_seq_len))
    config = RunConfig(data=str(_data(tmp_path)), model=str(toy_model), cache_dir=str(tmp_path / "cache"))
    for tokenized in ("first plan: tokenizes", "second plan: the token cache"):
        counted.update(facts=0, choices=0)
        plan = run.plan_run(config, measure=False).plan
        assert counted == {"facts": 1, "choices": 1}, tokenized
        assert "max_seq_len" in plan.auto  # Auto chose it
