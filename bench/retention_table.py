"""The markdown tables of bench/AUTO.md from bench/retention_price.py's JSON: one row per point, and one per instruction
kind. Nothing is computed here that the JSON does not hold; a point not measured yet is left out.

    python bench/retention_table.py bench/retention_price_issue48.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RATES = ("accuracy", "rule_pass_rate", "choice_accuracy", "instruction_following", "instructions_kept")
HEADER = (
    "| point | steps (× team-only) | tokens billed | house style | val loss: best / kept (scale) | general probe "
    "loss (kept) | accuracy | rule "
    "| multiple choice | instruction following (strict) | instructions kept | kinds below the base beyond their "
    "interval | team's voice | KL | flagged | wall: train+scale / check |"
)


def pct(x: float, digits: int = 0) -> str:
    return f"{100 * x:.{digits}f}%"


def pts(x: float, digits: int = 0) -> str:
    value = f"{100 * x:+.{digits}f}".replace("-", "−")
    return "0" if value.lstrip("+−").strip("0.") == "" else value


def change(m: dict, digits: int = 0) -> str:
    """'17.0% → 13.0% (−4, −8 to −0.1)': the rates and the change with its paired interval, in points."""
    low, high = pts(m["low"], max(digits, 1) if abs(m["low"]) < 0.01 else digits), pts(m["high"], digits)
    if abs(m["high"]) < 0.01:
        high = pts(m["high"], max(digits, 1))
    text = f"{pct(m['base'], digits)} → {pct(m['tuned'], digits)} ({pts(m['change'], digits)}, {low} to {high})"
    return f"**{text}**" if m.get("dropped") else text


def below(by_instruction: dict) -> str:
    """The instruction kinds whose whole interval of change is below 0, with their rates."""
    found = [f"{k} {pct(v['base'])} → {pct(v['tuned'])}" for k, v in sorted(by_instruction.items())
             if v.get("high") is not None and v["high"] < 0]  # fmt: skip
    return ", ".join(found) or "none"


def scored_cells(scored: dict) -> list[str]:
    r = scored["retention"]
    cells = [change(r[k], 1 if k.startswith("instruction") else 0) if k in r else "—" for k in RATES]
    cells.append(below(r.get("by_instruction") or {}))
    voice = r.get("team_voice")
    cells.append(f"{pct(voice['base'], 1)} → {pct(voice['tuned'], 1)}" + (" (rose)" if voice.get("rose") else "")
                 if voice else "—")  # fmt: skip
    cells.append(f"{r['kl_per_token']:.2f}")
    cells.append(", ".join(r["flagged"]) if r["flag"] else "no")
    return cells


def point_rows(row: dict) -> list[str]:
    steps = row["plan"]["total_steps"]
    ratio = steps / row["team_steps"] if row.get("team_steps") else None
    fit = f"{row['best_val_loss']:.3f} / {row['kept_val_loss']:.3f} ({row['kept_scale'] or 'off'})"
    probe = f"{row['kept_general_loss']:.3f}" if row.get("kept_general_loss") is not None else "—"
    seconds = row.get("measure_seconds") or {}
    wall = f"{row.get('train_and_scale_seconds') or '—'} s / {seconds.get('retention', '—')} s"
    lines = [
        f"| {row['name']} | {steps}{f' ({ratio:.2f}×)' if ratio else ''} | {row['tokens_billed']:,} | {pct(row['house_style'])} | {fit} | {probe} | "
        + " | ".join(scored_cells(row))
        + f" | {wall} |"
    ]
    for key, label in (("at_scale_1", "as trained"), ("earliest_fit", "earliest fit"),
                       ("earliest_fit_kept_scale", "earliest fit, kept scale")):  # fmt: skip
        extra = row.get(key)
        if not extra:
            continue
        where = f"step {extra['step']}, scale {extra.get('scale', 1):g}" if "step" in extra else "scale 1"
        loss = f"{extra['val_loss']:.3f} (scale 1)" if "val_loss" in extra else "—"
        lines.append(f"| ↳ {row['name']}: {label} ({where}) | — | — | {pct(extra['house_style'])} | {loss} | — | "
                     + " | ".join(scored_cells(extra)) + f" | — / {(extra.get('measure_seconds') or {}).get('retention', '—')} s |")  # fmt: skip
    return lines


def kinds_table(points: list[dict]) -> list[str]:
    kinds = sorted({k for p in points for k in p["retention"].get("by_instruction") or {}})
    lines = ["| instruction kind (n) | " + " | ".join(p["name"] for p in points) + " |",
             "|---|" + "---|" * len(points)]  # fmt: skip
    for kind in kinds:
        cells = []
        for p in points:
            v = (p["retention"].get("by_instruction") or {}).get(kind)
            if v is None:
                cells.append("—")
                continue
            text = f"{pct(v['base'])} → {pct(v['tuned'])}"
            if v.get("low") is not None:
                text += f" ({pts(v['low'])} to {pts(v['high'])})"
            cells.append(f"**{text}**" if v.get("high") is not None and v["high"] < 0 else text)
        n = next(
            p["retention"]["by_instruction"][kind]["n"] for p in points if kind in p["retention"]["by_instruction"]
        )
        lines.append(f"| {kind} ({n}) | " + " | ".join(cells) + " |")
    return lines


def retention_table(results: dict) -> str:
    points = results["points"]
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for row in points:
        lines += point_rows(row)
    return "\n".join([*lines, "", *kinds_table(points)])


if __name__ == "__main__":
    print(retention_table(json.loads(Path(sys.argv[1]).read_text())))
