"""The command-line reference, generated from the argparse parser `finetune` itself builds (commands/cli.py).

    commands(build_parser())   every command and subcommand, each with its parser (the stale-name test reads these)
    cli_page()                 the Markdown page: per command its help, arguments and flags (help, choices, default)

argparse has no public way to list a parser's arguments; `_actions` and `_SubParsersAction` are what every
argparse documentation tool reads (sphinx-argparse, mkdocs-click's argparse cousins), stable since Python 3.2.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

from markdown_table import cell, code, table

from finetune.commands.cli import build_parser


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]  # ("finetune", "serve", "purge")
    parser: argparse.ArgumentParser
    help: str

    @property
    def name(self) -> str:
        return " ".join(self.words)

    def arguments(self) -> list[argparse.Action]:
        """Its own arguments and flags, without -h and without the subcommand chooser."""
        return [a for a in self.parser._actions if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]

    def flags(self) -> set[str]:
        """Every flag it accepts, -h/--help included."""
        return {flag for action in self.parser._actions for flag in action.option_strings}

    def subcommands(self) -> dict[str, argparse.ArgumentParser]:
        return {name: p for a in self.parser._actions if isinstance(a, argparse._SubParsersAction)
                for name, p in a.choices.items()}  # fmt: skip


def commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ("finetune",), help: str = ""
) -> Iterator[Command]:
    """This command, then each subcommand under it, depth first in the parser's own order."""
    command = Command(words, parser, help or parser.description or "")
    yield command
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield from commands(sub, (*words, name), helps.get(name, ""))


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreConstAction):
        return ""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction | argparse._AppendAction):
        return ""  # a switch is off until given; a repeatable flag starts empty
    return code(action.default)


def _name(action: argparse.Action) -> str:
    """`--flag VALUE` as the user types it (a positional: its metavar)."""
    if not action.option_strings:
        return code(action.metavar or action.dest.upper())
    takes_value = action.nargs != 0
    value = action.metavar or action.dest.upper()
    return ", ".join(code(f"{flag} {value}" if takes_value else flag) for flag in action.option_strings)


def _help(action: argparse.Action) -> str:
    text = action.help if action.help not in (None, argparse.SUPPRESS) else ""
    if action.required and action.option_strings:
        text = f"**required.** {text}"
    return cell(text)


def _section(command: Command) -> str:
    lines = [f"## `{command.name}`\n", f"{cell(command.help)}\n"] if command.help else [f"## `{command.name}`\n"]
    subcommands = command.subcommands()
    if subcommands:
        lines.append(
            "Subcommands: " + ", ".join(f"[`{w}`](#{_anchor(command.words + (w,))})" for w in subcommands) + ".\n"
        )
    rows = [[_name(a), _help(a), ", ".join(code(c) for c in a.choices or ()), _default(a)] for a in command.arguments()]
    if rows:
        lines.append(table(["Argument", "Meaning", "Choices", "Default"], rows))
    return "\n".join(lines)


def _anchor(words: tuple[str, ...]) -> str:
    """The id MkDocs' table of contents gives the heading `## \\`finetune serve purge\\``."""
    return "-".join(words)


INTRO = """# Command line

Generated from the parser `finetune` builds (`finetune/commands/cli.py`, its settings' flags from RunConfig:
[Settings](settings.md)), so it lists exactly what `finetune COMMAND --help` accepts. A setting's flag has no
default of its own here: RunConfig's default applies (shown in its help) unless the flag or a `--config` YAML file
sets it.
"""


def cli_page() -> str:
    return INTRO + "\n" + "\n".join(_section(command) for command in commands(build_parser()))
