"""How a message names a setting to the person reading it: one wording, three renderings.

A message that advises a setting writes `ref("max_seq_len")` where the setting goes. That leaves a marker
in the text; messages keep their markers in memory, and every edge that shows or writes one (stdout, a JSON
file, an HTTP answer, an event) renders it for its reader:

    cli        --max-seq-len                                          (UserError's str(); render_plan; validate)
    api        method.supervised.hyperparameters.max_seq_len          (job errors, events, API answers)
    dashboard  the API wording, with each hyperparameter turned into its form field's label by the
               dashboard's own script (static/js/util.js: inDashboardTerms), from the schema the server serves

A process writes its files for its own reader: a trainer started by the service's worker writes plan.json and
report.json in API terms (AUDIENCE_ENV), one started from the command line in flags.

A message that points its reader at something to *do* (evaluate the model, compare checkpoints) writes `act("evaluate")`
the same way: the command line reads `finetune eval`, an API caller the route that does it, and the dashboard the
button or table on the page (ACTIONS holds the three wordings; the schema route serves them to the dashboard).

The names come from each setting's declaration (config.py; registry.py's `Setting.cli_name` and `api_name`): its
flag, its API key or top-level parameter, its label. A setting an API caller cannot set is named by its label, as
the server's.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from finetune.settings.registry import setting

Audience = Literal["cli", "api"]
AUDIENCE_ENV = "FINETUNE_AUDIENCE"  # "api:supervised" or "api:dpo": set by a service worker for the trainer it starts
_OPEN, _CLOSE = "\u2983", "\u2984"  # ⦃ ⦄: never typed by anyone, so a marker cannot be forged by data
MARKER = re.compile(f"{_OPEN}([a-z_]+)(?:=([^{_CLOSE}]*))?{_CLOSE}")


def ref(name: str, value: object = None) -> str:
    """A reference to a setting inside a message (with a value: the setting given that value), rendered where
    the message is shown."""
    setting(name)  # a typo in a setting's name fails where the message is written, in the tests
    return f"{_OPEN}{name}{'' if value is None else f'={value}'}{_CLOSE}"


# ---- actions: what a message tells its reader to do, in each reader's terms (cli, api, dashboard)
ACTIONS: dict[str, dict[str, str]] = {
    "evaluate": {
        "cli": "finetune eval",
        "api": "POST /v1/fine_tuning/jobs/{job_id}/evaluations",
        "dashboard": "the Evaluate button on this run's page",
    },
    "compare_checkpoints": {
        "cli": "finetune eval RUN --checkpoints compares each",
        "api": "GET /v1/fine_tuning/jobs/{job_id}/checkpoints lists each with its validation loss",
        "dashboard": "the Checkpoints table on this run's page lists each with its validation loss",
    },
}
ACTION_MARKER = re.compile(f"{_OPEN}@([a-z_]+){_CLOSE}")


def act(name: str) -> str:
    """A reference to something the reader can do (ACTIONS), rendered where the message is shown, like `ref`."""
    if name not in ACTIONS:
        raise KeyError(f"no action {name!r} in wording.ACTIONS")
    return f"{_OPEN}@{name}{_CLOSE}"


def for_cli(name: str) -> str:
    return setting(name).cli_name


def for_api(name: str, method_type: str = "supervised") -> str:
    return setting(name).api_name(method_type)


def _render_one(name: str, value: str | None, audience: Audience, method_type: str) -> str:
    if audience == "cli":
        return for_cli(name) if value is None else f"{for_cli(name)} {value}"
    if name == "method" and value == "dpo":  # preference tuning is the job's method type, not a hyperparameter
        return 'method type "dpo"'
    return for_api(name, method_type) if value is None else f"{for_api(name, method_type)} = {value}"


def process_audience() -> tuple[Audience, str]:
    """Who reads what this process writes: the command line's user, unless a service worker started it."""
    audience, _, method_type = os.environ.get(AUDIENCE_ENV, "cli").partition(":")
    return ("api" if audience == "api" else "cli"), method_type or "supervised"


def render(text: str, audience: Audience | None = None, method_type: str | None = None) -> str:
    """The message with every setting named in its reader's terms (default: this process's reader)."""
    if audience is None:
        audience, default_type = process_audience()
        method_type = method_type or default_type
    chosen: Audience = audience
    kind = method_type or "supervised"
    text = ACTION_MARKER.sub(lambda m: ACTIONS[m.group(1)][chosen], text)
    return MARKER.sub(lambda m: _render_one(m.group(1), m.group(2), chosen, kind), text)


def rendered(value: Any, audience: Audience | None = None, method_type: str | None = None) -> Any:
    """A JSON-like value with every message in it rendered: what an output edge (a file, an answer) writes."""
    if isinstance(value, str):
        return render(value, audience, method_type) if _OPEN in value else value
    if isinstance(value, dict):
        return {k: rendered(v, audience, method_type) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rendered(v, audience, method_type) for v in value]
    return value


def settings_named(text: str) -> list[str]:
    """The settings a message names, in order (the dashboard highlights their fields)."""
    return list(dict.fromkeys(name for name, _ in MARKER.findall(text)))
