"""The named choices of two data settings, `record_policy` and `truncation`: RunConfig declares them, the data path
(data/records.py, data/fitting.py) acts on them."""

from enum import StrEnum


class RecordPolicy(StrEnum):
    """How a conversation becomes training records."""

    ALL = "all"  # one record; every assistant message with weight > 0 is a target
    LAST = "last"  # one record; only the final assistant message is a target
    EACH = "each"  # one record per target turn, ending at that turn


class Truncation(StrEnum):
    """What happens to a record longer than the max sequence length (data/fitting.py)."""

    LEFT = "left"  # split it into records that fit, by whole turns; cut from the left only a turn too long alone
    DROP = "drop"  # drop the whole record
