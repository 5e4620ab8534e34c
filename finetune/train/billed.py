"""The bill of a run, from its records (no torch): what the plan bills, and the loop's count checked afterwards.

    team, records_of_team = team_lengths(records, mixed)           # the team's records' tokens (0: a replay row)
    billed = planned_bill(lengths, team, records_of_team, mixed, config)   # plan/build.Billed
    replay_trained = replay_tokens_trained(lengths, team, plan)    # replay rows' tokens the plan's steps read
    bill = checked_bill(records, plan, steps, counted_by_loop)     # report.json's `billing`

Who is billed for what is rules/billing.py's: the tenant's own records (its training file, its general conversations),
never the rows the base model answered. The training loop counts the billed tokens record by record as it reads them
(train/loop.py); `checked_bill` replays the schedule over the records (order.schedule_tokens) and says whether the
two agree: they must, since the records of each step follow from the seed, the epoch and the effective batch alone.
"""

from __future__ import annotations

import logging

from finetune.data.arrays import record_lengths
from finetune.data.replay_mix import billed_flags, billed_lengths, team_flags
from finetune.plan.build import Billed
from finetune.plan.plan import Plan
from finetune.rules.billing import billing
from finetune.train.order import schedule_tokens

log = logging.getLogger("finetune")


def team_lengths(records, mixed) -> tuple[list[int], int]:
    """Each training record's tokens if it is one of the team's (0 for a replay row: the mixed file's lines after the
    team's `team_rows`), and how many records are the team's."""
    flags = team_flags(records, mixed.team_rows if mixed is not None else None)
    return billed_lengths(records, flags), (sum(flags) if flags is not None else len(record_lengths(records)))


def planned_bill(lengths: list[int], team: list[int], team_records: int, mixed, config) -> Billed:
    """What build_plan needs to bill a run with replay rows mixed in: each record's tokens `lengths`, the team's
    `team` (0 for a replay row); the replay rows are billed when they are the tenant's own (`mixed.billed`)."""
    billed = lengths if mixed.billed else team

    def step_tokens(effective: int, steps: int) -> int:  # called only when a run reads part of its records
        return schedule_tokens(billed, effective, config.seed, config.last_batch, steps)

    return Billed(team_records, sum(team), sum(billed), step_tokens)


def replay_tokens_trained(lengths: list[int], team: list[int], plan: Plan) -> int | None:
    """The replay rows' tokens that the plan's steps read (None when the plan does not know its tokens)."""
    if plan.tokens_trained is None:
        return None
    replay = [length - mine for length, mine in zip(lengths, team, strict=True)]
    return schedule_tokens(replay, plan.effective_batch, plan.seed, plan.last_batch, plan.total_steps)


def checked_bill(records, plan: Plan, steps: int, counted: int, read: int) -> dict:
    """report.json's `billing`: the loop's count of the billed tokens (`counted`; `read`: every token it read), the
    schedule's replay of the same `steps` beside it, and whether they agree (a disagreement is logged: the loop's
    count is billed, it is what was read)."""
    lengths = billed_lengths(records, billed_flags(records, plan.replay_added))
    replayed = schedule_tokens(lengths, plan.effective_batch, plan.seed, plan.last_batch, steps)
    if replayed != counted:
        log.warning("billing check: the loop counted %d billed tokens, the schedule gives %d", counted, replayed)
    bill = billing(counted, read, plan.replay_added, "loop")
    return bill | {"schedule_check": {"tokens_billed": replayed, "agrees": replayed == counted}}
