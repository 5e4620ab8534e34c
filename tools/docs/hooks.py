"""MkDocs hook (mkdocs.yml `hooks:`): the reference pages are generated from the code at every build, as virtual
files, so nothing generated is committed and none can drift from the parser, the registry or the API.

    docs/reference/cli.md        from the argparse parser (cli_reference.py)
    docs/reference/settings.md   from RunConfig's registry (settings_reference.py)
    docs/reference/http.md       from the service's OpenAPI schema (http_reference.py)
"""

from __future__ import annotations

from cli_reference import cli_page
from http_reference import http_page
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from settings_reference import settings_page

GENERATED = {
    "reference/cli.md": cli_page,
    "reference/settings.md": settings_page,
    "reference/http.md": http_page,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, page in GENERATED.items():
        if files.get_file_from_path(path) is not None:
            raise ValueError(f"docs/{path} is generated at build time: delete the file of that name")
        files.append(File.generated(config, path, content=page()))
    return files
