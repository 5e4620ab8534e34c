"""Every `finetune` command and flag, setting key, API hyperparameter and HTTP route that README.md, DEVELOPERS.md
and docs/ name exists in the code (tools/docs/doc_mentions.py finds them; the parser, RunConfig's registry and the
service's routes are the truth). A rename in the code without the docs fails here, naming the file and line."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "tools" / "docs") not in sys.path:
    sys.path.insert(0, str(REPO / "tools" / "docs"))

from cli_reference import commands  # noqa: E402
from doc_mentions import Mention, mentions  # noqa: E402

import finetune  # noqa: E402, F401  (declares the settings)
from finetune.commands.cli import build_parser  # noqa: E402
from finetune.settings.registry import by_api_key, settings  # noqa: E402

DOCS = [REPO / "README.md", REPO / "DEVELOPERS.md", *sorted((REPO / "docs").rglob("*.md"))]

# Names the docs rightly write that are not finetune's: each with its reason. Keep it short.
NOT_OURS = {
    "--node-rank": "torchrun's, in docs/distributed.md's prose about two machines",
    "--rdzv-backend": "torchrun's, in docs/distributed.md's prose about elastic rendezvous",
    "DELETE /v1/things/{id}": "docs/service.md: an example of how an unnamed route's audit action is made",
    "POST /v1/things/{id}/archive": "the same example",
    "s3": "the storage config's top key (docs/storage.md: bucket/settings.py), a file of its own, not a run's setting",
}


@cache
def _commands() -> dict[tuple[str, ...], object]:
    """Each command's words after `finetune` -> its Command (the parser's)."""
    return {command.words[1:]: command for command in commands(build_parser())}


def _tree() -> dict[tuple[str, ...], set[str]]:
    return {words: set(command.subcommands()) for words, command in _commands().items()}


@cache
def _mentions() -> tuple[Mention, ...]:
    return tuple(m for path in DOCS for m in mentions(path, REPO, _tree()) if m.name not in NOT_OURS)


def _of(kind: str) -> list[Mention]:
    return [m for m in _mentions() if m.kind == kind]


def _stale(found: list[str]) -> None:
    assert not found, "named in the docs but not in the code:\n  " + "\n  ".join(found)


def test_the_docs_are_read():
    kinds = {m.kind for m in _mentions()}
    assert kinds == {"command", "flag", "setting", "hyperparameter", "route"}


def test_every_command_named_in_the_docs_exists():
    known = _tree()[()]
    _stale([f"{m.where()} {m.name}" for m in _of("command") if m.name.split()[1] not in known])


def test_every_flag_named_in_the_docs_is_a_flag_of_its_command():
    every_flag = set().union(*(command.flags() for command in _commands().values()))
    found = []
    for m in _of("flag"):
        command = _commands().get(m.command)
        flags = command.flags() if m.command and command else every_flag
        if m.name not in flags:
            found.append(
                f"{m.where()} {m.name} (of finetune {' '.join(m.command)})" if m.command else f"{m.where()} {m.name}"
            )
    _stale(found)


def test_every_setting_key_named_in_the_docs_is_a_setting():
    names = {s.name for s in settings()}
    _stale([f"{m.where()} {m.name}" for m in _of("setting") if m.name.replace("-", "_") not in names])


def test_every_api_hyperparameter_named_in_the_docs_exists():
    keys = set(by_api_key())
    _stale([f"{m.where()} hyperparameters.{m.name}" for m in _of("hyperparameter") if m.name not in keys])


@pytest.fixture(scope="module")
def served():
    """(method, path) -> whether the app `finetune serve` serves answers it (its own router decides)."""
    from http_reference import service_app
    from starlette.routing import Match

    with service_app() as app:

        def answers(method: str, path: str) -> bool:
            scope = {
                "type": "http",
                "method": method,
                "path": path,
                "root_path": "",
                "query_string": b"",
                "headers": [],
            }
            return any(route.matches(scope)[0] == Match.FULL for route in app.router.routes)

        yield answers


def _concrete(path: str) -> str:
    """`/v1/files/{file_id}` or `/v1/files/<id>` -> `/v1/files/x`: a path the router can be asked about."""
    import re

    return re.sub(r"\{[^}]*\}|<[^>]*>", "x", path)


def test_every_route_named_in_the_docs_is_served(served):
    found = []
    for m in _of("route"):
        method, path = m.name.split(" ", 1)
        if not served(method, _concrete(path)):
            found.append(f"{m.where()} {m.name}")
    _stale(found)


# ------------------------------------------------------------------ the reader itself, on a page written to test it

PAGE = """\
Run `finetune plan --no-such-flag` or `--also-missing` alone; with --gone-too in prose.

```bash
pip install --no-deps finetune            # pip's flag: not ours
torchrun --nnodes 2 -m finetune train data.jsonl --devices 16 --not-a-train-flag
finetune serve purge --tenant acme --dry-run | grep --count x && finetune nosuchcommand
```

```yaml
epochs: 2
no_such_setting: 1
```

```yaml
apiVersion: v1
kind: Pod
```

Its log says `finetune serve: worker 1 died`. Body: `{"hyperparameters": {"n_epochs": 2, "bogus": 1}}`,
`RunConfig(data="x", nope=1)`, `GET /v1/files/{file_id}` and `POST /v1/nowhere`.
"""


def test_the_reader_finds_stale_names_and_only_finetunes(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE, encoding="utf-8")
    found = {(m.kind, m.name, m.command) for m in mentions(page, tmp_path, _tree())}
    flags = {(name, command) for kind, name, command in found if kind == "flag"}
    assert ("--no-such-flag", ("plan",)) in flags and ("--also-missing", ()) in flags and ("--gone-too", ()) in flags
    assert ("--not-a-train-flag", ("train",)) in flags and ("--devices", ("train",)) in flags
    assert ("--dry-run", ("serve", "purge")) in flags  # the subcommand's flag, not serve's
    assert not {name for name, _ in flags} & {"--no-deps", "--nnodes", "--count"}  # pip's, torchrun's, grep's
    commands_named = {name for kind, name, _ in found if kind == "command"}
    assert "finetune nosuchcommand" in commands_named and "finetune serve:" not in commands_named
    settings_named = {name for kind, name, _ in found if kind == "setting"}
    assert settings_named == {"epochs", "no_such_setting", "data", "nope"}  # not the Kubernetes manifest's keys
    assert {name for kind, name, _ in found if kind == "hyperparameter"} == {"n_epochs", "bogus"}
    assert {name for kind, name, _ in found if kind == "route"} == {"GET /v1/files/{file_id}", "POST /v1/nowhere"}


def test_the_route_check_asks_the_services_own_router(served):
    assert served("GET", _concrete("/v1/fine_tuning/jobs/{job_id}/events"))
    assert served("GET", "/healthz")  # outside the OpenAPI schema, served all the same
    assert not served("POST", "/v1/files/x")  # the path exists, not with this method
    assert not served("GET", "/v1/nowhere")


# ------------------------------------------------------------------ the generated references cover the code


def test_the_command_line_reference_lists_every_command_and_flag():
    from cli_reference import cli_page

    page = cli_page()
    for command in _commands().values():
        assert f"## `{command.name}`" in page
        for flag in command.flags() - {"-h", "--help"}:
            assert f"`{flag}" in page, (command.name, flag)


def test_the_settings_reference_lists_every_setting_with_its_flag_and_api_name():
    from settings_reference import settings_page

    page = settings_page()
    for spec in settings():
        assert f"| `{spec.name}` |" in page
        if not spec.about.positional:
            assert f"`{spec.cli_name}`" in page
        if spec.api_key:
            assert f"`hyperparameters.{spec.api_key}`" in page


def test_the_http_reference_lists_every_route_of_the_schema_with_the_job_body():
    from http_reference import http_page, service_app

    with service_app() as app:
        schema = app.openapi()
    page = http_page(schema)
    for path, operations in schema["paths"].items():
        for method in operations:
            assert f"### `{method.upper()} {path}`" in page
    job = schema["paths"]["/v1/fine_tuning/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "training_file", "method"} <= set(job["properties"])
