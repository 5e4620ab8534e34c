"""The retention runs of bench/retention_price_smollm2.json judged again under the verdict of issue 47 (an exact
one-sided paired test per measure, Holm's correction across the check's measures: ship/eval/family.py).

    python bench/rejudge_holm.py            # prints, per run and measure: the discordant pairs, p, Holm's p, flagged

The JSON keeps each measure's rates and its 95% Newcombe interval, not the items' outcomes. The items whose outcome
changed (lost: base right, tuned wrong; gained: the other way) are recovered as the one pair of counts whose
Newcombe interval (intervals.paired_difference) reproduces the recorded one to its 4 decimals: a run where that pair
is not unique is reported as such, never guessed. instructions_kept is recovered at the instruction level (the
per-answer outcomes the cluster test needs were not recorded): its p here is the old, narrower reading.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune.ship.eval.family import holm, paired_p
from finetune.ship.eval.intervals import paired_difference

RESULTS = Path(__file__).resolve().parent / "retention_price_smollm2.json"
MEASURES = ("accuracy", "rule_pass_rate", "choice_accuracy", "instruction_following", "instructions_kept", "team_voice")


def discordant(numbers: dict) -> list[tuple[int, int]]:
    """Every (lost, gained) whose paired interval is the recorded one (the rates fix both margins)."""
    n = numbers["n"]
    base, tuned = round(numbers["base"] * n), round(numbers["tuned"] * n)
    found = []
    for lost in range(base + 1):
        gained = tuned - base + lost
        neither = n - (base - lost) - gained - lost
        if gained < 0 or neither < 0:
            continue
        change = paired_difference([True] * base + [False] * (n - base),
                                   [True] * (base - lost) + [False] * lost + [True] * gained + [False] * neither)  # fmt: skip
        if abs(change["low"] - numbers["low"]) < 6e-5 and abs(change["high"] - numbers["high"]) < 6e-5:
            found.append((lost, gained))
    return found


def main() -> None:
    for point in json.loads(RESULTS.read_text())["points"]:
        retention, pvalues = point["retention"], {}
        print(point["name"])
        for key in MEASURES:
            found = discordant(retention[key])
            if len(found) != 1:
                print(f"  {key}: {len(found)} pairs reproduce the interval: not judged again")
                continue
            lost, gained = found[0]
            pvalues[key] = paired_p({"lost": lost, "gained": gained}, "rise" if key == "team_voice" else "drop")
            recorded = retention[key].get("rose", retention[key].get("dropped"))
            print(f"  {key}: lost {lost}, gained {gained}, recorded as flagged: {recorded}")
        for key, decided in holm(pvalues).items():
            print(f"    {key}: p {decided['p']:.2g}, Holm {decided['p_holm']:.2g}, flagged now: {decided['rejected']}")


if __name__ == "__main__":
    main()
