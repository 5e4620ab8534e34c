"""What a run bills, and why: the tenant's own tokens the steps read; what the product adds on its own is not billed.

    bill = billing(tokens_billed, tokens_trained, replay_added, counted="planned")   # plan.json's, report.json's
    bill["message"]  # '140,412 tokens billed: the training file's conversations; 30,639 more trained on ...'

Billed: every token of a training record that is the tenant's own, once per step that reads it (the tokens in the
file x epochs, cut like the steps by a dropped last batch or max_steps). The tenant's own records are its training
file's conversations and, with `general_data`, the general conversations it gave: it chose to train on them, so they
are billed and count in the monthly quota. Not billed: the rows the base model answered for self-replay (the
product's own work, mixed in on its own initiative), and the passes that train nothing (the general validation
curve, the adapter scale's passes, evaluations): they are counted in the device time.

The loop counts the billed tokens record by record as it reads them (train/loop.py, kept in every checkpoint so a
resumed run bills what it read once); the run then replays the schedule over the records to check the count
(train/order.py `schedule_tokens`): `counted` names which figure a document holds.
"""

from __future__ import annotations

from finetune.settings.wording import ref

RULE = (
    "billed: every token of your own training records (your training file's conversations, and your general "
    f"conversations when you give {ref('general_data')}) once per step that reads it; not billed: the rows the base model "
    "answered for self-replay (the product's own work), the general validation curve, the adapter scale's passes "
    "and evaluations, which are counted in the device time"
)
COUNTED = {
    "planned": "the plan's count: the tokens of the records its steps read",
    "loop": "counted by the training loop, record by record, as it read them; checked against the schedule replayed "
    "over the records",
}


def billing(
    tokens_billed: int | None, tokens_trained: int | None, replay_added: dict | None, counted: str = "planned"
) -> dict:
    """The bill of a plan or a run: the tokens billed, the share of them from the general conversations the tenant
    gave (None without), the tokens trained on but not billed (the base's replay rows), how it was counted, the rule
    and one sentence."""
    replay = replay_added or {}
    general = replay.get("tokens_processed") if replay.get("billed") else None
    unbilled = None
    if tokens_trained is not None and tokens_billed is not None:
        unbilled = max(0, tokens_trained - tokens_billed)
    training_file = None if tokens_billed is None else tokens_billed - (general or 0)
    return {
        "tokens_billed": tokens_billed,
        "training_file_tokens": training_file,
        "general_data_tokens": general,
        "not_billed_tokens": unbilled,
        "counted": COUNTED[counted],
        "rule": RULE,
        "message": _sentence(tokens_billed, training_file, general, unbilled),
    }


def _n(value: int | None) -> str:
    return "an unknown number of" if value is None else f"{value:,}"


def _sentence(billed: int | None, training_file: int | None, general: int | None, unbilled: int | None) -> str:
    text = f"{_n(billed)} tokens billed"
    if general is not None:
        text += f": {_n(training_file)} of the training file's conversations and {_n(general)} of your general "
        text += f"conversations ({ref('general_data')})"
    else:
        text += ": the training file's conversations"
    if unbilled:
        text += f"; {_n(unbilled)} more tokens trained on replay rows the base model answered: not billed"
    return text
