"""Every call from the service into the training library, in one place: map OpenAI hyperparameters to a
RunConfig (generated from the settings' declarations), validate a file, plan a job, write the plan its trainer
executes, and say the library's errors and warnings in an API caller's terms.

Training itself never runs in the service's process: the worker plans the job once (`plan_job`), writes the plan,
and starts `python -m finetune train --plan JOB.plan.json --out RUN` (plus `--resume`), which checks the data and
code against the plan and executes it; its SIGTERM handling checkpoints and stops, and its run folder (plan.json,
metrics.jsonl, checkpoints/, report.json, adapter/ or model/) is what the service reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune.data.preference import load_pairs, read_preferences
from finetune.data.read import read_file
from finetune.data.sensitive import SENSITIVE_DATA, scanned_file
from finetune.data.skipped import usable_conversations
from finetune.data.tokenize import load_tokenizer
from finetune.data.types import Problem
from finetune.data.validate import validate_file
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import DataError, UserError
from finetune.settings.registry import Setting, settings
from finetune.settings.wording import for_api, render, settings_named

if TYPE_CHECKING:
    from finetune.plan.plan import Plan

# `method.type` of a job: supervised tuning, or preference tuning (RunConfig.method "dpo")
METHOD_TYPES = ("supervised", "dpo")
LR_MULTIPLIER = "learning_rate_multiplier"


class SettingsError(ValueError):
    """A hyperparameter an API caller gave cannot work; the message names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def api_settings(method_type: str) -> dict[str, Setting]:
    """Hyperparameter key -> the setting it sets, for a job of this method type (generated from RunConfig).

    Within a preference-tuning job the key `method` (lora or full) is the weights it trains (base_method)."""
    found: dict[str, Setting] = {}
    for spec in settings():
        key = spec.api_key
        if key is None or (key in found and (spec.about.when == "dpo") != (method_type == "dpo")):
            continue
        found[key] = spec
    return found


def settings_from_hyperparameters(hyper: dict[str, Any], method_type: str = "supervised") -> dict[str, Any]:
    """OpenAI hyperparameters (+ our own keys, each a RunConfig setting's declared API key) of a `method.type`
    ("supervised" or "dpo") -> RunConfig settings. Raises SettingsError for an unknown key or a value RunConfig
    refuses, naming the caller's key."""
    dpo = method_type == "dpo"
    known = api_settings(method_type)
    values: dict[str, Any] = {"method": "dpo"} if dpo else {}
    for key, value in (hyper or {}).items():
        spec = known.get(key)
        if spec is None:
            raise SettingsError(f"unknown hyperparameter {key!r}; known: {', '.join(sorted(known))}", key)
        if spec.about.when == "dpo" and not dpo:
            raise SettingsError(f"{key} is a preference-tuning setting: send method type 'dpo'", key)
        if key == LR_MULTIPLIER and value == AUTO:
            continue  # OpenAI's "auto": no factor on the rate
        if key == "method" and value not in ("lora", "full"):
            also = " (preference tuning is method type 'dpo')" if value == "dpo" else ""
            raise SettingsError(f"method must be 'lora' or 'full', got {value!r}{also}", key)
        values[spec.name] = value
    try:
        RunConfig(**values)
    except UserError as exc:
        raise SettingsError(exc.render("api", method_type), _blamed(exc.template, hyper, known)) from None
    except (TypeError, ValueError) as exc:
        raise SettingsError(str(exc), next(iter(hyper), "hyperparameters")) from None
    return values


def file_settings() -> tuple[Setting, ...]:
    """The settings an API caller sets with the id of a file it uploaded (About.api_file: general_data). The job
    keeps the id in its column (file_column; storage/db.py); the worker gives the run the stored upload."""
    return tuple(spec for spec in settings() if spec.about.api_file)


def file_column(name: str) -> str:
    """The jobs column that keeps the id of the upload a file setting names: general_data -> general_data_file."""
    return f"{name}_file"


def file_param(spec: Setting) -> str:
    """How an error about the file a file setting names points at it: `hyperparameters.general_data`."""
    return f"hyperparameters.{spec.api_key}"


def error_code(param: str) -> str:
    """An error's code for its param: invalid_training_file, or invalid_hyperparameters for any hyperparameter."""
    return "invalid_" + param.split(".", 1)[0]


def _blamed(template: str, hyper: dict[str, Any], known: dict[str, Setting]) -> str:
    """The caller's key a RunConfig message is about (the settings its template names)."""
    named = settings_named(template)
    for key in hyper:
        if key in known and known[key].name in named:
            return key
    return next(iter(hyper), "hyperparameters")


def run_config(
    settings: dict[str, Any], data: str, model: str, seed: int, val_file: str | None = None, out: str | None = None
) -> RunConfig:
    """The run of a job: `settings` with every file setting (general_data) a stored upload's path, never a caller's
    value (the API and the worker translate the ids)."""
    return RunConfig(**settings, data=data, model=model, seed=seed, val_file=val_file, out=out)


# ---------------------------------------------------------------------------------------------- validation


def screen_training_file(
    path: Path, shown_name: str, config: RunConfig, param: str, notes: list[dict] | None = None
) -> dict | None:
    """A job's file checked before its plan, with what needs no tokenizer: it reads (conversations or pairs), and
    its sensitive values go to `notes` (sensitive_data warn or redact). What needs the tokenizer (the template,
    the masks, the lengths) is the plan's own preparation, which tokenizes the file once, into the token cache its
    trainer reads. A file with a problem here, or one whose test split is held out before the plan reads it, is
    validated in full (validate_training_file): its error names every problem, as before a plan."""
    if config.method != "dpo" and not config.test_fraction:
        try:
            parsed, found = scanned_file(read_file(path, config.format), config.sensitive_data)
        except UserError:
            parsed = None
        if parsed is not None and parsed.ok:
            _note_sensitive(parsed.warnings, found, path, shown_name, config, notes)
            return None
    return validate_training_file(path, shown_name, config, param, notes)


def validate_training_file(
    path: Path, shown_name: str, config: RunConfig, param: str, notes: list[dict] | None = None
) -> dict | None:
    """OpenAI's `error` object for a file that cannot train (naming its first bad lines), or None when usable.
    `notes` receives what a usable file should still be told about, as events: the sensitive values found in it
    (counts by kind and role, lines; never a value), with sensitive_data warn or redact."""
    if config.skip_invalid:
        return _usable_once_skipped(path, shown_name, config, param, notes)
    try:
        if config.method == "dpo":  # pairs: the same checks as `finetune validate PREFS.jsonl`
            result, found = scanned_file(read_preferences(path), config.sensitive_data)
        else:
            tokenizer = load_tokenizer(config.model, config.trust_remote_code, config.chat_template)
            result = validate_file(str(path), tokenizer, format=config.format, config=config)  # long: only strict fails
            found = result.sensitive
    except UserError as exc:
        return _error(scrub(in_api_terms(exc, config), path, shown_name), param)
    _note_sensitive(result.warnings, found, path, shown_name, config, notes)
    return None if result.ok else _unusable(result.errors, path, shown_name, config, param)


def _usable_once_skipped(
    path: Path, shown_name: str, config: RunConfig, param: str, notes: list[dict] | None
) -> dict | None:
    """With skip_invalid, exactly what the plan's preparation takes: the lines that read left, with the invalid ones
    left out (usable_conversations, load_pairs: a problem of the whole file, or no valid line, is still an error),
    and the rest of the checks the plan's own (its `skipped_lines` warning names each line left out)."""
    dpo = config.method == "dpo"
    try:
        parsed = read_preferences(path) if dpo else read_file(path, config.format)
        load_pairs(str(path), skip_invalid=True) if dpo else usable_conversations(parsed, skip_invalid=True)
        parsed, found = scanned_file(parsed, config.sensitive_data)
    except UserError as exc:
        return _error(scrub(in_api_terms(exc, config), path, shown_name), param)
    refused = [problem for problem in parsed.errors if problem.code == SENSITIVE_DATA]  # sensitive_data refuse
    if refused:
        return _unusable(refused, path, shown_name, config, param)
    _note_sensitive(parsed.warnings, found, path, shown_name, config, notes)
    return None


def screen_general_data(
    path: Path, shown_name: str, config: RunConfig, param: str, notes: list[dict] | None = None
) -> dict | None:
    """A job's own general conversations (general_data) checked before its plan, as `general_rows` reads them:
    chat conversations, at least one, every problem named like a training file's; their sensitive values go to
    `notes`. The plan's preparation tokenizes them with the team's rows, in the replay mix."""
    try:
        parsed, found = scanned_file(read_file(path), config.sensitive_data)
    except UserError as exc:
        return _error(scrub(in_api_terms(exc, config), path, shown_name), param)
    if not parsed.ok:
        return _unusable(parsed.errors, path, shown_name, config, param)
    if not parsed.conversations:
        return _error(f"{shown_name}: no conversation in {for_api('general_data', method_type(config))}", param)
    _note_sensitive(parsed.warnings, found, path, shown_name, config, notes)
    return None


def _error(message: str, param: str) -> dict:
    """OpenAI's `error` object of a job's file."""
    return {"code": error_code(param), "message": message, "param": param}


def _unusable(errors: list[Problem], path: Path, shown_name: str, config: RunConfig, param: str) -> dict:
    """The error of a file with problems: how many, the first three by line, in the caller's terms."""
    first = errors[:3]
    lines = "; ".join(
        (f"line {p.line}" if p.line is not None else "file")
        + f" [{p.code}] {scrub(render(p.message, 'api', method_type(config)), path, shown_name)}"
        for p in first
    )
    more = f" (and {len(errors) - len(first)} more)" if len(errors) > len(first) else ""
    return _error(f"{shown_name}: {len(errors)} problem(s) make it unusable: {lines}{more}", param)


def _note_sensitive(
    warnings: list[Problem], found: dict, path: Path, shown_name: str, config: RunConfig, notes: list[dict] | None
) -> None:
    """The event of the sensitive values found in a usable file: counts by kind and role, lines; never a value."""
    for problem in warnings if notes is not None else []:
        if problem.code == "sensitive_data":
            message = scrub(render(problem.message, "api", method_type(config)), path, shown_name)
            counts = {k: v for k, v in found.items() if k not in ("findings", "files")}
            counts["files"] = {shown_name: where} if (where := next(iter(found["files"].values()), None)) else {}
            data = {"sensitive_data": counts}
            notes.append({"message": f"{shown_name}: [sensitive_data] {message}", "level": "warn", "data": data})


def planning_error(exc: UserError, config: RunConfig, files: list[tuple[Path, str, str]]) -> dict:
    """OpenAI's `error` object for a plan that failed: the data's problem (DataError) as invalid_training_file, a
    problem of another of the job's `files` ((path, name as uploaded, param), the training file first) as that
    file's (invalid_validation_file; general_data's as invalid_hyperparameters), anything else as
    invalid_hyperparameters; files named as uploaded, settings as API callers set them."""
    param = "training_file" if isinstance(exc, DataError) else "hyperparameters"
    param = next((named for path, _, named in files[1:] if str(path) in str(exc)), param)
    return _error(as_uploaded(in_api_terms(exc, config), {path: shown for path, shown, _ in files}), param)


def method_type(config: RunConfig) -> str:
    """The job's `method.type` for a RunConfig: "dpo" for preference tuning, else "supervised"."""
    return "dpo" if config.objective == "dpo" else "supervised"


def in_api_terms(exc: UserError, config: RunConfig) -> str:
    """An error's message with each setting named as an API caller sets it."""
    return exc.render("api", method_type(config))


def scrub(message: str, path: Path, shown_name: str) -> str:
    """Messages name the file the caller uploaded, never a path on the server, nor the stored upload's own name:
    the data path names a line by the file's name, `file-<id>:12`, which the caller knows as `support.jsonl:12`."""
    for form in (str(path.resolve()), str(path), path.name):  # the name alone: how summaries name a file (its id)
        message = message.replace(form, shown_name)
    return message


def as_uploaded(value: Any, files: dict[Path, str]) -> Any:
    """`value` (a message, or a document of them: a plan's warnings, its lists of lines) with every stored upload
    (`files`: path -> the name it was uploaded as) named as uploaded (scrub)."""
    if isinstance(value, dict):
        return {k: as_uploaded(v, files) for k, v in value.items()}
    if isinstance(value, list):
        return [as_uploaded(v, files) for v in value]
    if isinstance(value, str):
        for path, shown in files.items():
            value = scrub(value, path, shown)
    return value


# ---------------------------------------------------------------------------------------------- plan


def plan_job(config: RunConfig, out: Path | None = None, speed_of=None):
    """The job's first half of a run (test set held out into `out`, data prepared, plan): the one planning of it.
    Nothing is timed: the speed is the one this machine's runs left in its cache (a worker), or the pool's
    (`speed_of`, the API), else the plan's FLOP-based guess, which says so. With `out` (a worker preparing the job)
    the base answers self-replay's prompts here, its estimate and progress logged (the job's events); without (the
    API's plan) no model is loaded and nothing generated or written: replay and the forgetting curve are counted."""
    from finetune.run import plan_run  # torch, transformers: run.py is the whole run; loaded when a job is planned

    return plan_run(config, out, measure=False, speed_of=speed_of)


def resolved_hyperparameters(plan: Plan, method_type: str, file_ids: dict[str, str]) -> dict:
    """The job object's `hyperparameters`: every setting an API caller may set, as the plan resolved it, under its
    API key (OpenAI's n_epochs, batch_size, learning_rate_multiplier among them), plus the steps it makes. A file
    setting shows the id the caller sent (`file_ids`: setting -> id), never the stored upload's path."""
    resolved = {
        key: file_ids.get(spec.name) if spec.about.api_file else _plain(getattr(plan.run, spec.name))
        for key, spec in api_settings(method_type).items()
        if spec.applies(plan.objective, plan.method)
    }
    return resolved | {"method": plan.method, "total_steps": plan.total_steps}


def plan_answer(plan: Plan, model_name: str, files: dict[Path, str]) -> dict:
    """plan.json's content as an API caller may see it: no server path (the model by its registered name, files by
    their uploaded names, no settings block), every message in the caller's terms."""
    document = plan.to_dict("api", "dpo" if plan.objective == "dpo" else "supervised")
    document.pop("settings")
    document["model"] = model_name
    for warning in document["warnings"]:
        for path, shown in files.items():
            warning["message"] = scrub(warning["message"], path, shown)
    return document


def _plain(value: Any) -> Any:
    return value.value if hasattr(value, "value") else value


# ---------------------------------------------------------------------------------------------- training


def write_plan(plan: Plan, path: Path, method_type: str) -> None:
    """The job's plan for its trainer, its messages in an API caller's terms."""
    path.write_text(json.dumps(plan.to_dict("api", method_type), indent=2))
