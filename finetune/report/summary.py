"""The end-of-run summary: `OUT/report.json`, and the few lines printed when a run ends.

    report = build_report(rows, plan, diagnose(rows, spe), wall_time_s=..., final_weights="OUT/adapter",
                          final_is_best=True, tokens_processed=..., extra={"out_dir": "OUT"})
    write_report(report, "OUT/report.json")
    print_summary(report)

The report compares what the run did with its Plan: steps, tokens (exact: the plan counts the tokens of
the steps it plans), time and cost.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from finetune.plan.plan import Plan
from finetune.report.diagnosis import REMINDER, Diagnosis
from finetune.report.forgetting import read_forgetting
from finetune.rules.billing import billing
from finetune.settings.wording import rendered


def build_report(
    rows: list[dict],
    plan: Plan,
    diagnosis: Diagnosis,
    wall_time_s: float,
    final_weights: str,
    final_is_best: bool,
    tokens_processed: int,
    extra: dict | None = None,
    tokens_trained: int | None = None,
    bill: dict | None = None,
) -> dict:
    """The content of `report.json`: what the run did against what the plan said, and what its curves show.

    `tokens_processed` are the tokens billed (also under `tokens_billed`: the tenant's own, rules/billing.py),
    `tokens_trained` every token the loop read (with the base's replay rows; None: the same), `bill` what was billed
    and why (train/billed.checked_bill; None: the plan's rule applied to these numbers). `tokens_match` is None when
    the plan does not know its tokens (planned without a tokenizer).
    `extra` keys are added at the top level (e.g. `out_dir`, which print_summary shows); they may not
    replace a key of the report.
    """
    train = [r["train_loss"] for r in rows if r.get("train_loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    finite_val = [(s, v) for s, v in val if math.isfinite(v)]
    best_step, best_val = min(finite_val, key=lambda sv: sv[1]) if finite_val else (None, None)

    cost = plan.cost
    steps_taken = max((r["step"] for r in rows), default=0)
    tokens_planned = plan.tokens_processed
    price = cost.price_per_million_tokens

    report = {
        "steps_taken": steps_taken,
        "steps_planned": plan.total_steps,
        "steps_match": steps_taken == plan.total_steps,
        "epochs_completed": next((r["epoch"] for r in reversed(rows) if r.get("epoch") is not None), None),
        "first_train_loss": train[0] if train else None,
        "final_train_loss": train[-1] if train else None,
        "final_val_loss": val[-1][1] if val else None,
        "best_val_loss": best_val,
        "best_step": best_step,
        "diagnosis": {
            "kind": diagnosis.kind,
            "message": diagnosis.message,
            "next_step": diagnosis.next_step,
            "overfit_from_step": diagnosis.overfit_from_step,
        },
        "tokens_processed": tokens_processed,
        "tokens_billed": tokens_processed,
        "tokens_trained": tokens_processed if tokens_trained is None else tokens_trained,
        "billing": bill or billing(tokens_processed, tokens_trained, plan.replay_added, "loop"),
        "tokens_planned": tokens_planned,
        "tokens_match": None if tokens_planned is None else tokens_processed == tokens_planned,
        "wall_time_s": wall_time_s,
        "estimated_time_s": cost.seconds,  # the plan's estimate
        "gpu_hour_price": cost.gpu_hour_price,
        "time_cost": None if cost.gpu_hour_price is None else wall_time_s / 3600 * cost.gpu_hour_price * cost.devices,
        "price_per_million_tokens": price,
        "cost": None if price is None else tokens_processed / 1e6 * price,
        "final_weights": final_weights,
        "final_is_best": final_is_best,
        "reminder": diagnosis.reminder or REMINDER,
    }
    if (forgetting := read_forgetting(rows)) is not None:  # the forgetting curve (general_val); no key without it
        report["forgetting"] = forgetting
    clash = set(report) & set(extra or {})
    if clash:
        raise ValueError(f"extra keys would replace report keys: {sorted(clash)}")
    report.update(extra or {})
    report = rendered(report)  # the diagnosis names settings in its reader's terms (wording.py)
    return report


def write_report(report: dict, path: str | os.PathLike) -> Path:
    """Write `report` as indented JSON, atomically (a reader may be reading it)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return out


def print_summary(report: dict, console=None) -> None:
    """Print a short, readable summary of a report made by build_report (rich, to `console` or stdout)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    r = report
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()

    def line(label: str, text: str, style: str = "") -> None:
        grid.add_row(label, Text(text, style=style))  # Text: paths and messages are not rich markup

    steps = f"{r['steps_taken']}"
    if r.get("steps_planned") is not None:
        steps += f" of {r['steps_planned']} planned"
    if r.get("epochs_completed") is not None:
        steps += f" ({r['epochs_completed']:.2f} epochs)"
    line("steps", steps)
    if r.get("first_train_loss") is not None:
        line("train loss", f"{_num(r['first_train_loss'])} -> {_num(r['final_train_loss'])}")
    if r.get("best_val_loss") is not None:
        line("val loss", f"best {_num(r['best_val_loss'])} at step {r['best_step']}, final {_num(r['final_val_loss'])}")
    else:
        line("val loss", "no validation")
    line("tokens billed", _tokens(r), "" if r.get("tokens_match") is not False else "bold red")
    time = _duration(r["wall_time_s"])
    if r.get("estimated_time_s") is not None:
        time += f" (estimated {_duration(r['estimated_time_s'])})"
    line("time", time)
    if r.get("cost") is not None:
        line("cost", f"{r['cost']:.2f} ({r['price_per_million_tokens']} per million tokens)")
    if r.get("time_cost") is not None:
        line("time cost", f"{r['time_cost']:.4f} (measured time x {r['gpu_hour_price']} per device-hour)")
    if r.get("final_is_best"):
        which = "the best checkpoint" + (f", step {r['best_step']}" if r.get("best_step") is not None else "")
    else:
        which = "the last step (not the best checkpoint)"
    line("weights", f"{r['final_weights']} ({which})")
    if r.get("adapter_scale"):  # adapter_scale on (ship/adapter_scale.py)
        line("adapter scale", _scale(r["adapter_scale"]))
    out_dir = r.get("out_dir") or str(Path(r["final_weights"]).parent)
    line("outputs", f"{out_dir} (report.json, metrics.jsonl, loss_curve.png)")

    d = r["diagnosis"]
    line("diagnosis", f"{d['kind'].replace('_', ' ')}: {d['message']}", _KIND_STYLE.get(d["kind"], ""))
    line("next step", d["next_step"])
    if r.get("forgetting"):  # the forgetting curve: the team's fit and the general answers' drift
        line("general", r["forgetting"]["message"])

    console.print(Text("Run summary", style="bold underline"))
    console.print(grid)
    console.print(Text(r["reminder"], style="italic dim"))


_KIND_STYLE = {"good_fit": "green", "overfitting": "yellow", "underfitting": "yellow", "unstable": "red"}


def _scale(scale: dict) -> str:
    """The scale kept, why, and the measurements at it and at 1 (the adapter as trained)."""
    at = {m["alpha"]: m for m in scale.get("measured") or []}
    text = f"{scale['value']:g}: {scale['reason']}"
    kept, full, base = at.get(scale["value"]), at.get(1.0), at.get(0.0)
    if kept and full and kept is not full and kept.get("val_loss") is not None:
        text += f". Validation loss {_num(kept['val_loss'])} (at 1: {_num(full['val_loss'])})"
        if kept.get("general_loss") is not None and base:
            text += (
                f"; general probe loss {_num(kept['general_loss'])} (at 1: {_num(full['general_loss'])}, "
                f"the base: {_num(base['general_loss'])})"
            )
    return text


def _tokens(r: dict) -> str:
    text = f"{r['tokens_processed']:,}"
    if r.get("tokens_match") is True:
        text += " (as planned)"
    elif r.get("tokens_match") is False:
        text += f" (the plan said {r['tokens_planned']:,}: mismatch)"
    extra = (r.get("tokens_trained") or 0) - r["tokens_processed"]
    if extra > 0:
        text += f"; {extra:,} more trained on replay rows the base model answered (not billed)"
    general = (r.get("billing") or {}).get("general_data_tokens")
    if general:
        text += f"; {general:,} of them your general conversations' (billed)"
    return text


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"
