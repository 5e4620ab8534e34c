"""Every setting of a run, as the rest of the product sees it: derived from RunConfig's fields, declared once.

A field of RunConfig (config.py) declares a setting: its type (``Literal[...]`` or a StrEnum gives the
choices; ``int | str`` means a number or "auto"; ``X | None`` means it may be left unset), its default, the
docstring under it (the help text) and its `About` (label, API name, whether it changes the tokens, its resume
policy, when it applies). Everything else is generated here from that declaration:

- the command-line flags and the YAML keys (cli.add_setting_flags; `--config` files use the field names),
- the type and choice checks (coerce.py, run by RunConfig for the CLI, YAML and library alike),
- the token cache's key (`tokenizing_settings`), the resume fingerprint (fingerprint.py),
- the OpenAI hyperparameter mapping (service), the labels of the plan table, the model card and the dashboard,
  and the JSON schema the dashboard fetches (`hyperparameter_schema`),
- how a message names a setting to its reader (`Setting.cli_name`, `Setting.api_name`, which wording.py renders).

This module sits at the bottom of settings/ and imports no finetune module: RunConfig sits above it (its messages
name settings through wording.py, which reads the names here), so config.py hands the class over when it defines it
(`@declares_settings`). finetune/__init__ imports config.py, so the settings are known before any message exists.

Why hand-rolled introspection rather than a library (tyro, simple-parsing, pydantic-settings)? The declaration
is a plain dataclass the library, the YAML file and the CLI share; ~100 lines of `typing.get_type_hints` + `ast`
(for the field docstrings) keep it that way and keep `finetune plan` importable without heavy dependencies.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import textwrap
import types
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

AUTO = "auto"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SAME = "<the field's name>"


@dataclass(frozen=True)
class About:
    """What the product needs to know of a setting besides its type, default and help."""

    label: str
    """How people read it: the plan table, the model card, the dashboard's form field."""
    tokens: bool = True
    """Changing it changes the tokenized data (part of the token cache's key; errs on the side of True)."""
    resume: Literal["allow", "refuse"] | None = None
    """Part of the run's identity on --resume: `allow` (--allow-changes may cover a change) or `refuse`."""
    why_not: str = ""
    """With resume="refuse": why a checkpoint cannot carry a change over."""
    api: str | None = _SAME
    """The OpenAI-style hyperparameter key an API caller sets it with; None: callers cannot set it."""
    api_param: str | None = None
    """Set through a top-level parameter of the job instead (training_file, model, seed, ...)."""
    api_mention: str | None = None
    """How advice to an API caller names it, when not by its own key (the learning rate: its multiplier)."""
    api_file: bool = False
    """Its API value is the id of a file the caller uploaded, never a path: the service gives the run that upload."""
    plan_key: str | None = _SAME
    """Its key in plan.json (the resolved value); None: not recorded there."""
    when: Literal["lora", "dpo"] | None = None
    """It applies only to LoRA runs, or only to preference tuning (plan.json then shows null otherwise)."""
    validate: bool = False
    """A flag of `finetune validate` too (the data settings)."""
    train_only: bool = False
    """Only a run has it: not a flag of `finetune plan`."""
    positional: bool = False
    """A positional argument of the commands rather than a flag."""
    words: tuple[str, ...] = ()
    """Words a number setting also takes besides 'auto' (e.g. "off"); YAML's `off` (false) reads as "off"."""


def about(default: Any, label: str, **facts: Any) -> Any:
    """A RunConfig field: its default and its About (`dataclasses.field` with the facts as metadata)."""
    return dataclasses.field(default=default, metadata={"about": About(label, **facts)})


def in_a_sentence(label: str) -> str:
    """A label as words inside a sentence: "Learning rate" -> "learning rate"; "LoRA rank" keeps its capitals."""
    first = label.split(" ", 1)[0]
    return label if any(ch.isupper() for ch in first[1:]) else label[:1].lower() + label[1:]


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Setting:
    """One field of RunConfig as the CLI, the YAML reader, the checks and the renderings see it."""

    name: str
    kind: type  # int, float, bool or str
    choices: tuple[str, ...] | None  # from Literal[...] or a StrEnum
    auto: bool  # "auto" is a legal value
    optional: bool  # None is a legal value (left unset)
    default: Any
    help: str
    about: About

    @property
    def flag(self) -> str:
        return flag_of(self.name)

    @property
    def label(self) -> str:
        return self.about.label

    @property
    def cli_name(self) -> str:
        """How the command line names it: its flag (the one there is when it is on by default), or for a positional
        argument its label."""
        if self.about.positional:
            return self.label.lower()
        if self.kind is bool and self.default is True and not self.auto:
            return "--no-" + self.flag[2:]  # on by default: the only flag there is turns it off
        return self.flag

    def api_name(self, method_type: str = "supervised") -> str:
        """How an API caller names it: a top-level parameter, a hyperparameter of the method, or (when callers
        cannot set it) the server's setting by its label."""
        if self.about.api_param:
            return self.about.api_param
        key = self.about.api_mention or self.api_key
        if key is None:
            return f"the server's “{self.label}” setting"
        return f"method.{method_type}.hyperparameters.{key}"

    @property
    def api_key(self) -> str | None:
        """The hyperparameter key an API caller uses (None when callers cannot set it)."""
        return self.name if self.about.api == _SAME else self.about.api

    @property
    def plan_key(self) -> str | None:
        return self.name if self.about.plan_key == _SAME else self.about.plan_key

    def applies(self, objective: str, trained_weights: str) -> bool:
        """Whether the setting means anything for a run of this objective (sft|dpo) and weights (lora|full)."""
        when = self.about.when
        return when is None or (when == "dpo" and objective == "dpo") or (when == "lora" and trained_weights == "lora")

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        what = {int: "a whole number", float: "a number", bool: "on or off", str: "text"}[self.kind]
        words = ([AUTO] if self.auto else []) + list(self.about.words)
        return what + "".join(f", or '{word}'" if i else f" or '{word}'" for i, word in enumerate(words))

    def parse(self, text: str) -> Any:
        """A value written as text (a flag, a YAML string) -> its Python value; ValueError when it is none."""
        lowered = text.strip().lower()
        if self.auto and lowered == AUTO:
            return AUTO
        if lowered in self.about.words:
            return lowered
        if self.optional and self.kind is not str and lowered == "none":
            return None
        if self.choices or self.kind is str:
            return text
        if self.kind is bool:
            if lowered in _TRUE + _FALSE:
                return lowered in _TRUE
            raise ValueError(text)
        return self.kind(text)

    def schema(self) -> dict:
        """This setting as a JSON Schema property (for the dashboard's form)."""
        types_ = {int: "integer", float: "number", bool: "boolean", str: "string"}
        kinds = [types_[self.kind]] + (["string"] if self.auto and self.kind is not str else [])
        kinds += ["null"] if self.optional else []
        prop: dict[str, Any] = {"title": self.label, "description": self.help}
        prop["type"] = kinds[0] if len(kinds) == 1 else kinds
        if self.choices:
            prop["enum"] = list(self.choices)
        if self.auto and self.kind is not str:
            prop["examples"] = [AUTO, *self.about.words]
        default = self.default.value if isinstance(self.default, enum.Enum) else self.default
        prop["default"] = default
        prop["x-finetune"] = {
            "setting": self.name, "flag": self.flag, "auto": self.auto, "when": self.about.when, "plan_key": self.plan_key,
            "file": self.about.api_file,
        }  # fmt: skip
        return prop


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field (Python keeps none of them at run time, so read the source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        if documented and isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _setting(f: dataclasses.Field, hint: Any, help_text: str) -> Setting:
    choices = None
    optional = auto = False
    if get_origin(hint) is Literal:
        kind, choices = str, tuple(get_args(hint))
        auto = AUTO in choices
    elif isinstance(hint, type) and issubclass(hint, enum.StrEnum):  # the data path's own names for its choices
        kind, choices = str, tuple(member.value for member in hint)
    elif get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        optional = len(args) < len(get_args(hint))
        auto = str in args and len(args) > 1
        kind = next(a for a in args if a is not str) if auto else args[0]
    else:
        kind = hint
    return Setting(f.name, kind, choices, auto, optional, f.default, help_text, f.metadata["about"])


_DECLARED: list[type] = []  # RunConfig, once config.py has defined it
Declaring = TypeVar("Declaring", bound=type)


def declares_settings(cls: Declaring) -> Declaring:
    """Class decorator: the fields of `cls` (RunConfig) are the settings of a run."""
    _DECLARED[:] = [cls]
    settings.cache_clear()
    setting.cache_clear()
    return cls


@cache
def settings() -> tuple[Setting, ...]:
    """Every setting of RunConfig, in declaration order."""
    if not _DECLARED:
        raise RuntimeError("no settings are declared yet: finetune.settings.config declares them")
    (config,) = _DECLARED
    hints = get_type_hints(config)
    docs = _field_docs(config)
    return tuple(_setting(f, hints[f.name], docs.get(f.name, "")) for f in dataclasses.fields(config))


@cache
def setting(name: str) -> Setting:
    """The setting called `name`; KeyError for a name no setting has (a typo in a message's `ref`)."""
    found = next((s for s in settings() if s.name == name), None)
    if found is None:
        raise KeyError(f"no setting {name!r}")
    return found


def command_settings(command: str) -> tuple[Setting, ...]:
    """The settings a command takes as flags: `validate` the data ones, `plan` all but a run's own, `train` all."""
    if command == "validate":
        chosen = [s for s in settings() if s.about.validate]
    elif command == "plan":
        chosen = [s for s in settings() if not s.about.train_only]
    else:
        chosen = list(settings())
    return tuple(s for s in chosen if not s.about.positional)


def tokenizing_settings() -> tuple[str, ...]:
    """The settings that change the tokenized data: the token cache's key covers each of them."""
    return tuple(s.name for s in settings() if s.about.tokens)


def by_api_key() -> dict[str, Setting]:
    """Hyperparameter key -> setting, for what an API caller may set."""
    return {s.api_key: s for s in settings() if s.api_key is not None}


def plan_labels() -> dict[str, str]:
    """plan.json key -> label, for every setting recorded in the plan."""
    return {s.plan_key: s.label for s in settings() if s.plan_key is not None}


def hyperparameter_schema(objective: str | None = None) -> dict:
    """A JSON Schema of the hyperparameters an API caller may set (all, or those of one objective)."""
    props = {
        s.api_key: s.schema()
        for s in settings()
        if s.api_key is not None and (objective is None or s.about.when != "dpo" or objective == "dpo")
    }
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "properties": props}
