"""Markdown tables for the generated reference pages: one place that knows how a cell is escaped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(text: object) -> str:
    """Text as one table cell: a pipe would end the cell and a newline the row; `<` would open an HTML tag."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;")


def code(text: object) -> str:
    """Text as a code span (Python-Markdown's tables split no cell at a pipe inside backticks, and escape nothing in
    it: `N|auto` stays as it is)."""
    text = " ".join(str(text).split())
    return f"`{text}`" if text else ""


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
