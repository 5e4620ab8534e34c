"""Does the toy demo's tuned model answer, or recite? The demo's run with one value changed at a time, scored on what
`finetune demo` prints: house style, and the answers the team would sign (invented specifics, recited training
replies, distinct answers: finetune/ship/eval/grounding.py).

    nice -n 10 python bench/toy_grounding.py [--base DIR] [--points auto,epochs-2,...] [--checkpoints]
                                              [--json bench/toy_grounding.json]

Each point trains exactly as `finetune demo` does (examples/train.jsonl, every value Auto's but the point's own,
the validation share Auto's) on a toy base (the demo's pretrained base, or the point's own pretraining), answers
the 60 held-out prompts of examples/test.jsonl greedily (the demo's 192 new tokens) with the run's final weights and,
with --checkpoints, with every checkpoint the run kept (all of them: one per evaluation). Prints a table and writes
the rows as JSON (bench/AUTO.md, "Answers the team would sign", quotes them).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EXAMPLES = REPO / "examples"


@dataclass(frozen=True)
class Point:
    """One run: a name, the RunConfig values it sets (the rest are Auto's) and the toy base's pretraining changes."""

    name: str
    values: dict = field(default_factory=dict)
    pretraining: dict = field(default_factory=dict)  # Pretraining fields (finetune/ship/toy.py) the base is built with


POINTS = {
    p.name: p
    for p in (
        Point("auto"),
        Point("epochs-1", {"epochs": 1}),
        Point("epochs-2", {"epochs": 2}),
        Point("epochs-3", {"epochs": 3}),
        Point("rank-4", {"lora_rank": 4, "lora_alpha": 8.0}),
        Point("lr-half", {"lr": "half"}),
        Point("no-head", {"lora_train_head": False}),
    )
}


def _base(point: Point, cache: Path | None, log) -> Path:
    from finetune.ship.toy import BASE_PRETRAINING, pretrained_base

    return pretrained_base(pretraining=replace(BASE_PRETRAINING, **point.pretraining), cache=cache, log=log)[0]


def _config(point: Point, base: Path, out: Path):
    from finetune.run import plan_run
    from finetune.settings.config import RunConfig

    values = dict(point.values)
    config = RunConfig(data=str(EXAMPLES / "train.jsonl"), model=str(base), out=str(out), **_fixed(values))
    if values.get("lr") == "half":  # Auto's own rate for this run, halved
        with contextlib.redirect_stdout(io.StringIO()):
            rate = plan_run(config, out.with_name(out.name + "-plan")).plan.learning_rate
        config = replace(config, lr=rate / 2)
    return config


def _fixed(values: dict) -> dict:
    return {k: v for k, v in values.items() if not (k == "lr" and v == "half")}


def _score(weights_run: Path, step: int | None, prompts, markers, training) -> dict:
    from finetune.commands.demo import MAX_NEW_TOKENS
    from finetune.ship.eval.generate import generate_answers, style_rate
    from finetune.ship.eval.grounding import measure
    from finetune.ship.run_folder import load_for_generation, locate_weights

    model, tokenizer = load_for_generation(locate_weights(weights_run, step))
    answers = generate_answers(model, tokenizer, prompts, max_new_tokens=MAX_NEW_TOKENS)
    section, _ = measure(prompts, {"tuned": answers}, training)
    tuned, team = section["models"]["tuned"], section["models"]["reference"]
    return {
        "step": step,
        "house_style": style_rate(answers, markers),
        "invented": tuned["invented"]["count"],
        "invented_rate": tuned["invented"]["rate"],
        "reference_invented_rate": team["invented"]["rate"],
        "recited": tuned["recited"]["count"],
        "distinct": tuned["distinct"]["count"],
        "answers": section["answers"],
    }


def run_point(point: Point, work: Path, prompts, markers, checkpoints: bool, cache: Path | None) -> dict:
    from finetune.run import train
    from finetune.ship.eval.grounding import training_replies_of
    from finetune.ship.run_folder import checkpoint_steps

    started = time.perf_counter()
    base = _base(point, cache, log=None)
    built = time.perf_counter() - started
    out = work / point.name
    shutil.rmtree(out, ignore_errors=True)
    config = _config(point, base, out)
    if checkpoints:
        config = replace(config, keep_checkpoints=1000)
    began = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        result = train(config)
    trained = time.perf_counter() - began
    plan = json.loads((out / "plan.json").read_text())
    training = training_replies_of(out)
    row = {
        "name": point.name,
        "set": point.values,
        "pretraining": point.pretraining,
        "base_seconds": round(built, 1),
        "train_seconds": round(trained, 1),
        "epochs": plan["epochs"],
        "lr": plan["learning_rate"],
        "lora_rank": plan.get("lora_rank"),
        "steps": plan["total_steps"],
        "best_step": result.report.get("best_step"),
        "best_val_loss": result.report.get("best_val_loss"),
        "final": _score(out, None, prompts, markers, training),
    }
    if checkpoints:
        row["checkpoints"] = [_score(out, step, prompts, markers, training) for step in checkpoint_steps(out)]
    shutil.rmtree(out, ignore_errors=True)
    return row


def table(rows: list[dict]) -> str:
    head = (
        "| point | epochs | lr | steps | step scored | house style | invents (team's) | recites | distinct | train s |"
    )
    lines = [head, "|---" * 10 + "|"]
    for row in rows:
        for score in [row["final"], *row.get("checkpoints", [])]:
            label = "final" if score is row["final"] else f"step {score['step']}"
            lines.append(
                f"| {row['name']} | {row['epochs']} | {row['lr']:.2g} | {row['steps']} | {label} "
                f"(best {row['best_step']}) | {score['house_style']:.0%} | {score['invented']}/{score['answers']} "
                f"({score['reference_invented_rate']:.0%}) | {score['recited']} | {score['distinct']} | "
                f"{row['train_seconds']:.0f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default="auto", help=f"comma-separated, of: {', '.join(POINTS)}")
    parser.add_argument("--checkpoints", action="store_true", help="also score every checkpoint the run kept")
    parser.add_argument("--cache", help="where toy bases are built (default: the cache root)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    from finetune.commands.demo import _load_examples

    prompts, markers = _load_examples()
    rows = []
    with tempfile.TemporaryDirectory(prefix="toy-grounding-") as work:
        for name in args.points.split(","):
            rows.append(run_point(POINTS[name], Path(work), prompts, markers, args.checkpoints, args.cache))
            print(table(rows[-1:]), flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
