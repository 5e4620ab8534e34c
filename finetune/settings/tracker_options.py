"""The settings report_to and tracker_options, checked without importing any tracker's library.

    parse_report_to("TensorBoard, mlflow")       -> "tensorboard,mlflow"
    parse_tracker_options('{"wandb": {"project": "p"}}', "wandb") -> {"wandb": {"project": "p"}}
    check_installed("mlflow")                     # ConfigError naming `pip install 'finetune[mlflow]'`

The options are names and tags only (a project, a run name, an experiment): credentials never go through
them, they come from the environment of the process that trains (docs/trackers.md).
"""

from __future__ import annotations

import importlib.util
import json

from finetune.settings.errors import ConfigError
from finetune.settings.wording import ref

TRACKERS = ("tensorboard", "mlflow", "wandb")
# the module each tracker imports; `finetune[<tracker>]` installs it
MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
# each tracker's options: name -> "text" or "tags" (a list of texts)
OPTIONS = {
    "tensorboard": {},
    "mlflow": {"experiment": "text", "run_name": "text"},
    "wandb": {"project": "text", "name": "text", "entity": "text", "tags": "tags"},
}
NO_TRACKER = ("", "none")


def tracker_names(report_to: str | None) -> list[str]:
    """The trackers of a checked report_to value, in its order."""
    return [name for name in (report_to or "").split(",") if name]


def parse_report_to(value: str | None) -> str | None:
    """A comma list of tracker names -> the same list lower-cased without blanks or repeats; None for none."""
    if value is None or value.strip().lower() in NO_TRACKER:
        return None
    names: list[str] = []
    for part in value.split(","):
        name = part.strip().lower()
        if name and name not in names:
            names.append(name)
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise ConfigError(
            f"{ref('report_to')}: unknown tracker(s) {', '.join(unknown)}; "
            f"choose any of {', '.join(TRACKERS)}, separated by commas (e.g. {ref('report_to', 'tensorboard,mlflow')})"
        )
    return ",".join(names) or None


def parse_tracker_options(value: str | None, report_to: str | None) -> dict[str, dict]:
    """tracker_options (JSON: tracker -> its options) -> a checked dict; {} when unset."""
    if value is None or not value.strip():
        return {}
    try:
        options = json.loads(value)
    except ValueError as exc:
        example = '{"wandb": {"project": "p"}}'
        raise ConfigError(f"{ref('tracker_options')} must be a JSON object, e.g. '{example}' ({exc})") from None
    if not isinstance(options, dict):
        example = '{"wandb": {...}}'
        raise ConfigError(f"{ref('tracker_options')} must be a JSON object of tracker -> options, e.g. '{example}'")
    named = tracker_names(report_to)
    for tracker, given in options.items():
        if tracker not in named:
            raise ConfigError(
                f"{ref('tracker_options')} has options for {tracker!r}, which {ref('report_to')} does not name "
                f"({report_to or 'no tracker'}); add it to {ref('report_to')} or drop its options"
            )
        known = OPTIONS[tracker]
        if not isinstance(given, dict):
            raise ConfigError(f"{ref('tracker_options')}: {tracker}'s options must be an object, got {given!r}")
        for key, item in given.items():
            if key not in known:
                choices = ", ".join(known) or "none"
                raise ConfigError(f"{ref('tracker_options')}: {tracker} has no option {key!r} (its options: {choices})")
            if known[key] == "text" and not isinstance(item, str | None):
                raise ConfigError(f"{ref('tracker_options')}: {tracker}.{key} must be text, got {item!r}")
            if known[key] == "tags" and not (isinstance(item, list) and all(isinstance(t, str) for t in item)):
                raise ConfigError(f"{ref('tracker_options')}: {tracker}.{key} must be a list of texts, got {item!r}")
    return options


def check_installed(report_to: str | None) -> None:
    """Refuse, before anything is written, a tracker whose library is not installed (one sentence, how to fix)."""
    for name in tracker_names(report_to):
        if importlib.util.find_spec(MODULES[name]) is None:
            raise ConfigError(
                f"{ref('report_to', name)} needs the {MODULES[name]} package: pip install 'finetune[{name}]'"
            )
