"""The command line's setting flags, generated from RunConfig's declarations (settings.py): one `--flag-name` per
setting a command takes, its type, choices, default and help from the field; YAML files (`--config`) and flags
together make the RunConfig."""

from __future__ import annotations

import argparse
from argparse import SUPPRESS
from typing import Any

from finetune.settings.config import RunConfig
from finetune.settings.registry import Setting, command_settings, settings


def _value_parser(spec: Setting):
    def parse(text: str) -> Any:
        try:
            return spec.parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {spec.describe()}, got {text!r}") from None

    parse.__name__ = spec.describe()  # argparse names the type in its error message
    return parse


def add_setting_flags(p: argparse.ArgumentParser, command: str) -> None:
    """One flag per RunConfig setting the command takes (config.command_settings): name, type, choices and
    help all come from the field's declaration. Defaults are left to RunConfig (and the YAML file): only
    flags the user gives are passed on."""
    for spec in command_settings(command):
        default = "none" if spec.default is None else spec.default
        if spec.kind is bool and not spec.auto:
            if spec.default:  # on by default: the flag turns it off
                p.add_argument(f"--no-{spec.flag[2:]}", dest=spec.name, action="store_false", default=SUPPRESS,
                               help=f"{spec.help} (on unless this flag is given)")  # fmt: skip
            else:
                p.add_argument(spec.flag, dest=spec.name, action="store_true", default=SUPPRESS, help=spec.help)
            continue
        metavar = (
            {int: "N", float: "X", bool: "on|off", str: "TEXT"}[spec.kind]
            + ("|auto" if spec.auto else "")
            + "".join("|" + w for w in spec.about.words)
        )
        p.add_argument(
            spec.flag,
            dest=spec.name,
            type=_value_parser(spec),
            choices=spec.choices,
            default=SUPPRESS,
            metavar=metavar if not spec.choices else None,
            help=f"{spec.help} (default: {default})",
        )


def _config_from_args(args: argparse.Namespace, data: str | None, command: str) -> RunConfig:
    names = {s.name for s in settings()}
    given = {k: v for k, v in vars(args).items() if k in names}
    if data is not None:
        given["data"] = data
    config = RunConfig.from_yaml(args.config, **given) if getattr(args, "config", None) else RunConfig(**given)
    config.check_required(command)
    return config
