"""Every call from the service into the training library, in one place: map OpenAI hyperparameters to a
RunConfig, validate a file, plan a run, the `finetune train` command line, and reading a run folder.

Training itself never runs in the service's process: the worker starts `python -m finetune train --config
job.yaml --out RUN` (plus `--resume`), whose SIGTERM handling checkpoints and stops, and whose run folder
(plan.json, metrics.jsonl, checkpoints/, report.json, adapter/ or model/) is what the service reads.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from finetune.config import AUTO, RunConfig
from finetune.errors import DataError, UserError

# OpenAI's names -> RunConfig's
OPENAI_KEYS = {"n_epochs": "epochs", "batch_size": "batch_size"}
LR_MULTIPLIER = "learning_rate_multiplier"
# `method.type` -> RunConfig.method; within a DPO job our `method` key (lora/full) is RunConfig.base_method
METHOD_TYPES = ("supervised", "dpo")
DPO_ONLY = ("beta", "sft_weight", "base_method")
# RunConfig settings an API caller may not set: paths, code execution, and what the service decides itself
NOT_FOR_CALLERS = {
    *("data", "val_file", "model", "out", "resume", "trust_remote_code", "seed"),
    *("price_per_million_tokens", "gpu_hour_price"),  # the server's prices, not the caller's
}
SETTABLE = {f.name for f in dataclasses.fields(RunConfig)} - NOT_FOR_CALLERS


class SettingsError(ValueError):
    """A hyperparameter an API caller gave cannot work; the message names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def settings_from_hyperparameters(
    hyper: dict[str, Any], method_type: str = "supervised"
) -> tuple[dict[str, Any], float | None]:
    """OpenAI hyperparameters (+ our own RunConfig keys) of a `method.type` ("supervised" or "dpo") ->
    (RunConfig settings, learning-rate multiplier).

    Raises SettingsError for an unknown key or a value RunConfig refuses."""
    dpo = method_type == "dpo"
    settings: dict[str, Any] = {"method": "dpo"} if dpo else {}
    multiplier: float | None = None
    for key, value in (hyper or {}).items():
        if key == LR_MULTIPLIER:
            if value != AUTO:
                if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                    raise SettingsError(f"{key} must be a positive number or 'auto', got {value!r}", key)
                multiplier = float(value)
            continue
        name = OPENAI_KEYS.get(key, key)
        if name not in SETTABLE:
            known = sorted({*OPENAI_KEYS, LR_MULTIPLIER, *SETTABLE} - set(OPENAI_KEYS.values()))
            raise SettingsError(f"unknown hyperparameter {key!r}; known: {', '.join(known)}", key)
        if not dpo and name in DPO_ONLY:
            raise SettingsError(f"{key} is a preference-tuning setting: send method type 'dpo'", key)
        if name == "method":
            if value not in ("lora", "full"):
                also = " (preference tuning is method type 'dpo')" if value == "dpo" else ""
                raise SettingsError(f"method must be 'lora' or 'full', got {value!r}{also}", key)
            name = "base_method" if dpo else "method"
        settings[name] = value
    try:
        RunConfig(**settings)
    except (UserError, TypeError, ValueError) as exc:
        raise SettingsError(_in_api_terms(str(exc)), _blamed(str(exc), hyper)) from None
    return settings, multiplier


def _blamed(message: str, hyper: dict[str, Any]) -> str:
    """The caller's key a RunConfig message is about (its messages name the flag, e.g. --epochs)."""
    for key in hyper:
        flags = [f"--{OPENAI_KEYS.get(key, key).replace('_', '-')}"] + (["--base-method"] if key == "method" else [])
        if any(flag in message for flag in flags):
            return key
    return next(iter(hyper), "hyperparameters")


def _in_api_terms(message: str) -> str:
    for key, name in OPENAI_KEYS.items():
        message = message.replace(f"--{name.replace('_', '-')}", key)
    return message


def run_config(
    settings: dict[str, Any], data: str, model: str, seed: int, val_file: str | None = None, out: str | None = None
) -> RunConfig:
    return RunConfig(**settings, data=data, model=model, seed=seed, val_file=val_file, out=out)


# ---------------------------------------------------------------------------------------------- validation


def validate_training_file(path: Path, shown_name: str, config: RunConfig, param: str) -> dict | None:
    """OpenAI's `error` object for a file that cannot train (naming its first bad lines), or None when usable."""
    from finetune.data.preference import read_preferences
    from finetune.data.tokenize import load_tokenizer
    from finetune.data.validate import validate_file

    try:
        if config.method == "dpo":  # pairs: the same checks as `finetune validate PREFS.jsonl`
            result = read_preferences(path)
        else:
            tokenizer = load_tokenizer(config.model, config.trust_remote_code, config.chat_template)
            result = validate_file(str(path), tokenizer, config.max_seq_len, config.record_policy)
    except UserError as exc:
        return {"code": f"invalid_{param}", "message": scrub(str(exc), path, shown_name), "param": param}
    if result.ok:
        return None
    first = result.errors[:3]
    lines = "; ".join(
        (f"line {p.line}" if p.line is not None else "file") + f" [{p.code}] {scrub(p.message, path, shown_name)}"
        for p in first
    )
    more = f" (and {len(result.errors) - len(first)} more)" if len(result.errors) > len(first) else ""
    return {
        "code": f"invalid_{param}",
        "message": f"{shown_name}: {len(result.errors)} problem(s) make it unusable: {lines}{more}",
        "param": param,
    }


def planning_error(exc: UserError, data: Path, data_name: str, val: Path | None, val_name: str | None) -> dict:
    """OpenAI's `error` object for a plan that failed: the data's problem (DataError) as invalid_training_file or
    invalid_validation_file, anything else as invalid_hyperparameters; files named as uploaded."""
    message = scrub(str(exc), data, data_name)
    param = "training_file" if isinstance(exc, DataError) else "hyperparameters"
    if val is not None and str(val) in str(exc):
        param = "validation_file"
        message = scrub(message, val, val_name or val.name)
    return {"code": f"invalid_{param}", "message": message, "param": param}


def scrub(message: str, path: Path, shown_name: str) -> str:
    """Messages name the file the caller uploaded, never a path on the server."""
    for form in (str(path.resolve()), str(path)):
        message = message.replace(form, shown_name)
    return message


# ---------------------------------------------------------------------------------------------- plan


def plan_for(config: RunConfig, lr_multiplier: float | None = None) -> tuple[RunConfig, dict]:
    """The plan (plan.json's content) and the config that reproduces it. A learning-rate multiplier scales the
    rate Auto picks for this data and model, so the plan is made twice (the tokenized data is small)."""
    from finetune.plan.command import make_plan

    plan = make_plan(config)
    if lr_multiplier is not None and lr_multiplier != 1.0:
        config = dataclasses.replace(config, lr=plan.learning_rate * lr_multiplier)
        plan = make_plan(config)
    return config, plan.to_dict()


def resolved_hyperparameters(plan: dict, lr_multiplier: float | None) -> dict:
    """The job object's `hyperparameters`: OpenAI's three keys (and DPO's beta) resolved, plus ours."""
    resolved = {
        "n_epochs": plan["epochs"],
        "batch_size": plan["batch_size"],
        "learning_rate_multiplier": lr_multiplier or 1.0,
        "learning_rate": plan["learning_rate"],
        "method": plan["method"],
        "lora_rank": plan["lora_rank"],
        "lora_train_head": plan.get("lora_train_head"),
        "total_steps": plan["total_steps"],
    }
    if plan.get("objective") == "dpo":
        resolved |= {"beta": plan["beta"], "sft_weight": plan["sft_weight"]}
    return resolved


# ---------------------------------------------------------------------------------------------- training


def write_job_config(config: RunConfig, path: Path) -> None:
    values = {k: v for k, v in config.to_dict().items() if k not in ("out", "resume")}
    path.write_text(yaml.safe_dump(values, sort_keys=True))


def train_command(config_path: Path, out: Path, resume: bool) -> list[str]:
    """The library's own command line; `--devices N` in the config makes it launch N processes (torchrun)."""
    command = [sys.executable, "-m", "finetune", "train", "--config", str(config_path), "--out", str(out), "--json"]
    return [*command, "--resume"] if resume else command


# ---------------------------------------------------------------------------------------------- run folder


def read_plan(run: Path) -> dict | None:
    try:
        return json.loads((run / "plan.json").read_text())
    except (OSError, ValueError):
        return None


def read_report(run: Path) -> dict | None:
    try:
        return json.loads((run / "report.json").read_text())
    except (OSError, ValueError):
        return None


def read_metrics(run: Path) -> list[dict]:
    """metrics.jsonl's complete lines (a line being written is skipped until it is whole)."""
    try:
        text = (run / "metrics.jsonl").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            rows.append(json.loads(line))
        except ValueError:
            break
    return rows


def checkpoint_steps(run: Path) -> list[int]:
    """Steps of the checkpoints in RUN/checkpoints/step-NNNNNN (train/checkpoint.py's layout; read here without
    importing that module, which loads torch: a worker never needs torch itself)."""
    root = run / "checkpoints"
    if not root.is_dir():
        return []
    found = [p.name[len("step-") :] for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")]
    return sorted(int(step) for step in found if step.isdigit())


def final_weights(run: Path) -> Path | None:
    for name in ("adapter", "model"):
        if (run / name).is_dir():
            return run / name
    return None
