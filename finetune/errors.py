"""Errors meant for the user: the command line prints their message and exits 1, never a traceback."""


class UserError(Exception):
    """Something the user can fix: bad input, a bad setting, a missing file. The message says what and where."""


class DataError(UserError):
    """The data cannot be trained on as it is (the message names the file), rather than a setting being wrong."""
