"""The HTTP reference, generated from the OpenAPI schema FastAPI builds for the app `finetune serve` serves
(service/dashboard/app.py): every route of the schema with its summary, parameters, body and responses.

    service_app()   the app, on a throwaway data folder and SQLite database (nothing listens)
    http_page()     the Markdown page
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path

from fastapi import FastAPI
from markdown_table import cell, code, table

from finetune.service.dashboard.app import create_app
from finetune.service.options import ServiceOptions


@contextlib.contextmanager
def service_app() -> Iterator[FastAPI]:
    with tempfile.TemporaryDirectory(prefix="finetune-docs-") as folder:
        app = create_app(ServiceOptions(data_dir=Path(folder)))
        try:
            yield app
        finally:
            app.state.store.close()


def _type(schema: dict) -> str:
    """A JSON Schema in a few words: `integer (1 to 100)`, `string or null`, `one of all, last, each`."""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type(option) for option in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    if kind == "array":
        kind = f"array of {_type(schema.get('items', {}))}"
    if "pattern" in schema:
        kind += f" matching {schema['pattern']}"
    bounds = [
        f"≥ {schema['minimum']}" if "minimum" in schema else "",
        f"≤ {schema['maximum']}" if "maximum" in schema else "",
    ]
    return kind + (f" ({', '.join(b for b in bounds if b)})" if any(bounds) else "")


def _parameters(operation: dict) -> str:
    rows = [
        [code(p["name"]), p["in"], cell(_type(p.get("schema", {}))), "yes" if p.get("required") else "",
         code(p["schema"]["default"]) if "default" in p.get("schema", {}) else "", cell(p.get("description", ""))]
        for p in operation.get("parameters", [])
    ]  # fmt: skip
    return "**Parameters**\n\n" + table(["Name", "In", "Type", "Required", "Default", "Meaning"], rows) if rows else ""


def _body(operation: dict) -> str:
    body = operation.get("requestBody")
    if not body:
        return ""
    parts = []
    for media, content in body.get("content", {}).items():
        schema = content.get("schema", {})
        required = set(schema.get("required", ()))
        rows = [
            [code(name), cell(_type(prop)), "yes" if name in required else "", cell(prop.get("description", ""))]
            for name, prop in schema.get("properties", {}).items()
        ]
        fields = table(["Field", "Type", "Required", "Meaning"], rows) if rows else ""
        parts.append(
            f"**Body** ({code(media)}){': ' + cell(schema['description']) if 'description' in schema else ''}\n\n{fields}"
        )
    return "\n".join(parts)


def _responses(operation: dict) -> str:
    return "**Responses**: " + "; ".join(f"{code(status)} {cell(r.get('description', ''))}"
                                         for status, r in operation.get("responses", {}).items()) + "\n"  # fmt: skip


def _operation(method: str, path: str, operation: dict) -> str:
    lines = [f"### `{method.upper()} {path}`\n", f"{cell(operation.get('summary', ''))}.\n"]
    if operation.get("description"):
        lines.append(operation["description"].strip() + "\n")
    lines += [part for part in (_parameters(operation), _body(operation)) if part]
    lines.append(_responses(operation))
    return "\n".join(lines)


def _area(path: str) -> str:
    """`/v1/fine_tuning/jobs/{job_id}` -> `fine_tuning`: the section a route is listed under."""
    parts = path.strip("/").split("/")
    return parts[1] if parts[0] == "v1" and len(parts) > 1 else parts[0]


INTRO = """# HTTP API

Generated from the OpenAPI schema the service builds (FastAPI, `GET /v1/openapi.json` on a running
`finetune serve`), so it lists exactly the routes the service answers. Every `/v1` route needs
`Authorization: Bearer <API key>` (or the dashboard's session cookie); a 4xx or 5xx answer is OpenAI's error envelope.
What the routes do together, with examples: [The job service](../service.md). Outside the schema: `GET /healthz`,
`GET /readyz` and `GET /metrics` for operations, and the dashboard at `GET /`.
"""


def http_page(schema: dict | None = None) -> str:
    if schema is None:
        with service_app() as app:
            schema = app.openapi()
    operations = [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]
    sections = [INTRO]
    for area, group in groupby(sorted(operations, key=lambda o: _area(o[0])), key=lambda o: _area(o[0])):
        sections.append(f"## {area.replace('_', ' ').capitalize()}\n")
        sections += [_operation(method, path, op) for path, method, op in group]
    return "\n".join(sections)
