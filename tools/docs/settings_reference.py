"""The settings table, generated from RunConfig's registry (finetune/settings/registry.py): for each setting its
YAML key, flag, API hyperparameter, dashboard field, default and meaning, and the commands that take it."""

from __future__ import annotations

import enum

from markdown_table import cell, code, table

import finetune  # noqa: F401  (config.py declares the settings when the package is imported)
from finetune.settings.registry import Setting, command_settings, settings

COMMANDS = ("validate", "plan", "train")


def _default(spec: Setting) -> str:
    value = spec.default.value if isinstance(spec.default, enum.Enum) else spec.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return code("on" if value else "off")
    return code(value)


def _api(spec: Setting) -> str:
    """How an API caller sets it: a top-level parameter of the job, a hyperparameter of its method, or not at all."""
    if spec.about.api_param:
        return code(spec.about.api_param)
    if spec.api_key is None:
        return "the server's"
    return code(f"hyperparameters.{spec.api_key}")


def _dashboard(spec: Setting) -> str:
    """The New job form has a field for what an API caller may set (its schema's title is the label)."""
    return cell(spec.label) if spec.api_key is not None or spec.about.api_param else ""


def _commands(spec: Setting) -> str:
    if spec.about.positional:
        return "positional: " + ", ".join(COMMANDS[1:])
    return ", ".join(c for c in COMMANDS if spec in command_settings(c))


def _meaning(spec: Setting) -> str:
    when = {"lora": " *(LoRA runs)*", "dpo": " *(preference tuning)*"}.get(spec.about.when or "", "")
    return cell(spec.help) + when


def _row(spec: Setting) -> list[str]:
    flag = "" if spec.about.positional else code(spec.cli_name)
    return [code(spec.name), flag, _api(spec), _dashboard(spec), _default(spec), _meaning(spec), _commands(spec)]


INTRO = """# Settings

Every setting of a run, generated from its one declaration: the fields of `RunConfig`
(`finetune/settings/config.py`). The same setting is

- a **YAML key** of a `--config` file (dashes or underscores), and `RunConfig(key=...)` from Python,
- a **flag** of the commands listed (a flag given on the command line wins over the YAML file),
- an **API** parameter of `POST /v1/fine_tuning/jobs`: a hyperparameter of the job's method
  (`method.supervised.hyperparameters.KEY`, or `method.dpo.hyperparameters.KEY`), or a top-level parameter of the job;
  "the server's" means callers cannot set it: the server decides,
- a **dashboard field** of the New job form, labelled as shown.

`auto` means Auto chooses the value and the plan says why ([How Auto decides](../auto.md)).

"""


def settings_page() -> str:
    headers = ["YAML key", "Flag", "API", "Dashboard field", "Default", "Meaning", "Commands"]
    return INTRO + table(headers, (_row(spec) for spec in settings()))
