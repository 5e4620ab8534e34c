"""Errors meant for the user: the command line prints their message and exits 1, never a traceback."""


class UserError(Exception):
    """Something the user can fix: bad input, a bad setting, a missing file. The message says what and where."""


class DataError(UserError):
    """The data cannot be trained on as it is (the message names the file), rather than a setting being wrong."""


class RecordError(UserError):
    """One record of a data file cannot be tokenized (the template refuses it, or its replies cannot be located).
    It knows its line, not its file: the caller that read the file names it (`FILE:LINE: reason`)."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line, self.reason = line, reason

    def __reduce__(self):  # raised in a tokenizing worker, re-raised in the parent: keep both fields
        return RecordError, (self.line, self.reason)
