"""Errors meant for the user: the command line prints their message and exits 1, never a traceback.

A message may name settings with `wording.ref(name)`; `str(error)` names them for this process's reader (the
command line's flags, `--max-seq-len`, unless a service worker started it), `error.render("api")` as an API
caller sets them, and `error.template` keeps the markers for an edge that renders it later.
"""

from finetune.settings.wording import render

ERROR_FILE_ENV = "FINETUNE_ERROR_FILE"  # set by a service worker: the trainer writes the error it stops on there


class UserError(Exception):
    """Something the user can fix: bad input, a bad setting, a missing file. The message says what and where."""

    @property
    def template(self) -> str:
        """The message with its setting markers (wording.py), not yet rendered for a reader."""
        return str(self.args[0]) if self.args else ""

    def render(self, audience: str | None = None, method_type: str | None = None) -> str:
        """The message for a reader: "cli" (flags) or "api" (hyperparameter keys); default this process's reader."""
        return render(self.template, audience, method_type)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict:
        """What a caller in another process needs to say it in its own reader's terms."""
        return {"type": type(self).__name__, "template": self.template, "message": str(self)}


class DataError(UserError):
    """The data cannot be trained on as it is (the message names the file), rather than a setting being wrong."""


class ConfigError(UserError, ValueError):
    """A setting has a value that cannot work; the message names the setting (wording.py renders it)."""


class RecordError(UserError):
    """One record of a data file cannot be tokenized (the template refuses it, or its replies cannot be located).
    It knows its line, not its file: the caller that read the file names it (`FILE:LINE: reason`)."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line, self.reason = line, reason

    def __reduce__(self):  # raised in a tokenizing worker, re-raised in the parent: keep both fields
        return RecordError, (self.line, self.reason)
