"""What a file holds, in the numbers a person plans with: conversations, messages, records, tokens.

    records = build_all_records(parsed.conversations, "all")
    counts = [estimate_record_tokens(r, 1024) for r in records]            # no tokenizer: estimates
    stats = summarize(parsed.conversations, counts, "all", 1024, tokens_exact=True)

(Exact counts come from the model's tokenizer: validate.py fits each record to the limit with fitting.py and
counts what training takes.) Messages are not records: a conversation of 3 replies is 1 record under the `all`
policy and 3 under `each`, and the number of optimizer steps follows the records. Both are reported, clearly
named. A record's tokens are counted before a cut from the left; `over_max_seq_len` says what would be cut.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from finetune.data.records import build_records
from finetune.data.types import Conversation, Message, Record, TokenizedRecord
from finetune.settings.data_choices import RecordPolicy

BYTES_PER_TOKEN_ESTIMATE = 4  # typical for English BPE; only used without a tokenizer
TEMPLATE_TOKENS_PER_MESSAGE_ESTIMATE = 4  # role header and end-of-turn around each message
PERCENTILES = (50, 90, 95)


@dataclass(frozen=True)
class RecordTokens:
    """The token numbers of one record, before truncation."""

    record: Record
    total: int  # tokens of the whole record
    target: int  # scored tokens (weight > 0), end-of-turn included
    cut: int  # tokens over the max sequence length: what truncation would have to cut
    tokenized: TokenizedRecord | None = None  # exact counts only: the record as it would be trained (after truncation)
    dropped: str | None = None  # exact counts only: why training would drop it, e.g. "target_would_be_cut"

    @property
    def context(self) -> int:
        return self.total - self.target


def build_all_records(conversations: list[Conversation], policy: RecordPolicy | str) -> list[Record]:
    """Every training record of a file's conversations, in file order."""
    return [record for i, conv in enumerate(conversations) for record in build_records(conv, i, policy)]


# ----------------------------------------------------------------------------- counting one record


def estimate_tokens(text: str) -> int:
    """About how many tokens `text` is, without a tokenizer: one per 4 bytes of UTF-8."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN_ESTIMATE)


def message_text(message: Message) -> str:
    """What a message contributes to the text: its content, then its tool calls as name and arguments."""
    return message.content + "".join(f"{call.name} {call.arguments}" for call in message.tool_calls)


def estimate_record_tokens(record: Record, max_seq_len: int) -> RecordTokens:
    """Token numbers from the text alone: content estimate + template tokens per message, + end-of-turn per target.

    Tool schemas are context: their JSON text is counted once per record, never as a target.
    """
    total = estimate_tokens(json.dumps(list(record.tools))) if record.tools else 0
    target = 0
    before_first_target = None  # context tokens ahead of the first scored one: all a cut from the left may take
    for i, message in enumerate(record.messages):
        tokens = estimate_tokens(message_text(message))
        if i in record.targets and before_first_target is None:
            before_first_target = total + TEMPLATE_TOKENS_PER_MESSAGE_ESTIMATE
        total += tokens + TEMPLATE_TOKENS_PER_MESSAGE_ESTIMATE
        if i in record.targets:
            target += tokens + 1  # + end-of-turn
    cut = max(0, total - max_seq_len)
    dropped = "target_would_be_cut" if max_seq_len > 0 and cut and cut >= (before_first_target or 0) else None
    return RecordTokens(record, total, target, cut, dropped=dropped)


# ----------------------------------------------------------------------------- the file


def percentile(values: list[int], q: float) -> int:
    """Nearest-rank percentile (q in 0..100) of whole numbers; 0 when there are none."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summarize(
    conversations: list[Conversation],
    counts: list[RecordTokens],
    policy: RecordPolicy | str,
    max_seq_len: int,
    tokens_exact: bool,
) -> dict:
    """The stats block of `finetune validate --json`: plain numbers with self-explaining keys."""
    lengths = [c.total for c in counts]
    over = [c for c in counts if c.cut > 0]
    return {
        "conversations": len(conversations),
        "messages": sum(len(conv.messages) for conv in conversations),
        "records": len(counts),
        "record_policy": str(RecordPolicy(policy)),
        "target_tokens": sum(c.target for c in counts),
        "context_tokens": sum(c.context for c in counts),
        "tokens_exact": tokens_exact,
        "record_tokens": {f"p{q}": percentile(lengths, q) for q in PERCENTILES} | {"max": max(lengths, default=0)},
        "max_seq_len": max_seq_len,
        "over_max_seq_len": {"records": len(over), "tokens_cut": sum(c.cut for c in over)},
    }
