"""A value checked against its setting's declaration: what RunConfig runs on every field, for the CLI, YAML files and
the library alike.

    coerce(setting("epochs"), "3")          -> 3
    coerce(setting("schedule"), "step")     # ConfigError: --schedule must be one of linear, cosine, got 'step'
"""

from __future__ import annotations

import math
from typing import Any

from finetune.settings.errors import ConfigError
from finetune.settings.registry import AUTO, Setting
from finetune.settings.wording import ref


def coerce(spec: Setting, value: Any) -> Any:
    """The value as its declaration types it (text parsed); ConfigError naming the setting when it is not one."""
    if value is None:
        if spec.optional:
            return None
        raise ConfigError(f"{ref(spec.name)} needs a value: {spec.describe()}")
    bad = ConfigError(f"{ref(spec.name)} must be {spec.describe()}, got {value!r}")
    if isinstance(value, str) and spec.kind is not str:
        try:
            value = spec.parse(value)
        except ValueError:
            raise bad from None
        if value is None:  # "none": left unset
            return None
    if spec.choices:
        if value not in spec.choices:
            raise bad
        return spec.choices[spec.choices.index(value)]  # a plain string, also for a StrEnum member
    if (spec.auto and value == AUTO) or value in spec.about.words:
        return value
    if value is False and "off" in spec.about.words:  # YAML reads a bare `off` as false
        return "off"
    if spec.kind is bool and not isinstance(value, bool):
        raise bad
    if spec.kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise bad
    if spec.kind is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise bad
        value = float(value)
        if not math.isfinite(value):  # nan and inf pass every range check: refuse them by name
            raise ConfigError(f"{ref(spec.name)} must be a finite number, got {value!r}")
    if spec.kind is str and not isinstance(value, str):
        raise bad
    return value
