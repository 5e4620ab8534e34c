"""Does Auto keep what the base knew? The demo's run on a real base, with and without each retention mechanism.

    nice -n 5 python bench/retention_sweep.py --base smollm2-135m-instruct --points auto,replay-1 \
        [--json bench/retention_sweep_smollm2.json] [--resume]

Every point is the demo's run (`finetune demo`: every value Auto's, examples/train.jsonl, Auto's validation cut), with
only the named values set, and is scored by what the issue names:
- the best validation loss on the team's data (the run's own), and house style (exact greeting and sign-off) on the
  60 held-out prompts of examples/test.jsonl, greedy answers of up to 192 new tokens, as the demo measures it;
- `finetune eval RUN --retention` on the whole general set: accuracy, rule pass-rate and multiple choice, each with
  its paired 95% interval, the KL to the base per token, and the flag. The general set is the check's, never moved.
When Auto's adapter scale picked a scale below 1, the same run is also checked at scale 1 (its adapter before
scaling), so one run shows what the scale bought; `--at-scale RUN:X` checks a finished run's adapter at X times the
scale it was written with. Points are written as they finish; `--resume` skips those done.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EXAMPLES = REPO / "examples"
MAX_NEW_TOKENS = 192  # the demo's budget
POINTS = {  # name -> the RunConfig values it sets; everything else is Auto's
    "auto": {},
    "scale-auto": {"adapter_scale": "auto"},
    "replay-0.25": {"replay": 0.25},
    "replay-0.5": {"replay": 0.5},
    "replay-1": {"replay": 1.0},
    "replay-1-scale-auto": {"replay": 1.0, "adapter_scale": "auto"},
    "replay-auto": {"replay": "auto"},
    "rank-4": {"lora_rank": 4},
    "epochs-2": {"epochs": 2},
}


def _interval(measure: dict) -> dict:
    change = measure["change"]
    return {
        "n": measure["n"],
        "base": round(measure["base"]["rate"], 4),
        "tuned": round(measure["tuned"]["rate"], 4),
        "change": round(change["value"], 4),
        "low": round(change["low"], 4),
        "high": round(change["high"], 4),
        "dropped": measure.get("dropped", False),  # the team's voice flags a rise (`rose`), not a drop
        "p_holm": measure.get("p_holm"),
    }


def retention_row(run: Path) -> dict:
    from finetune.ship.eval.retention import RETENTION_FILE, check_retention, write_retention

    written = run / RETENTION_FILE
    weights = run / "adapter" if (run / "adapter").is_dir() else run / "model"
    if written.is_file() and written.stat().st_mtime > weights.stat().st_mtime:  # this run's check, made already
        report = json.loads(written.read_text(encoding="utf-8"))
    else:
        report = check_retention(run)
        write_retention(run, report)
    from finetune.ship.eval.retention import MEASURES

    row = {key: _interval(report[key]) for key in MEASURES if report[key]["n"]}
    if report["team_voice"]["n"]:
        row["team_voice"] = _interval(report["team_voice"]) | {"rose": report["team_voice"]["rose"]}
    return row | {
        "by_instruction": {k: {"n": v["n"], "base": round(v["base"], 3), "tuned": round(v["tuned"], 3)}
                           | ({"low": round(v["change"]["low"], 4), "high": round(v["change"]["high"], 4)}
                              if "change" in v else {})
                           for k, v in report["by_instruction"].items()},
        "kl_per_token": round(report["kl"]["mean_per_token"], 4),
        "flag": report["flag"],
        "flagged": report["flagged"],
        "seconds": report["seconds"]["total"],
        "general_set": report["general_set"]["digest"],
    }  # fmt: skip


def house_style(run: Path, prompts, markers) -> float:
    """The demo's measure; the team's prompts get the run's team system message when it trained with one."""
    from finetune.data.team_context import bound_conversation
    from finetune.ship.eval.generate import generate_answers, style_rate
    from finetune.ship.run_folder import load_for_generation, locate_weights, team_system_of

    if system := team_system_of(run):
        prompts = [bound_conversation(c, system) for c in prompts]
    model, tokenizer = load_for_generation(locate_weights(run))
    return style_rate(generate_answers(model, tokenizer, prompts, max_new_tokens=MAX_NEW_TOKENS), markers)


def rescaled_copy(run: Path, factor: float, name: str) -> Path:
    """A copy of the run (checkpoints left out) with its adapter's lora_alpha times `factor` (the output layer is tied
    on a real base, so the alpha is the whole scale)."""
    copy = run.with_name(f"{run.name}-{name}")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    config_path = copy / "adapter" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["lora_alpha"] = config["lora_alpha"] * factor
    config_path.write_text(json.dumps(config, indent=2))
    return copy


def at_scale(run: Path, scale: float) -> dict:
    """House style and retention of a finished run's adapter at another scale, relative to the one written."""
    from finetune.data.read import read_file

    copy = rescaled_copy(run, scale, f"scale-{scale:g}")
    style = json.loads((EXAMPLES / "house_style.json").read_text())
    prompts = read_file(str(EXAMPLES / "test.jsonl")).conversations
    rate = house_style(copy, prompts, [style["greeting"], style["sign_off"]])
    return {"scale": scale, "house_style": rate, "retention": retention_row(copy)}


def run_point(name: str, values: dict, model_dir: Path, out: Path) -> dict:
    from finetune.data.read import read_file
    from finetune.run import train
    from finetune.settings.config import RunConfig

    run = out / name
    shutil.rmtree(run, ignore_errors=True)
    config = RunConfig(data=str(EXAMPLES / "train.jsonl"), model=str(model_dir), out=str(run), **values)
    started = time.perf_counter()
    report = train(config).report
    trained = time.perf_counter()
    plan = json.loads((run / "plan.json").read_text())
    style = json.loads((EXAMPLES / "house_style.json").read_text())
    prompts = read_file(str(EXAMPLES / "test.jsonl")).conversations
    rate = house_style(run, prompts, [style["greeting"], style["sign_off"]])
    styled = time.perf_counter()
    row = {
        "name": name,
        "values": values,
        "plan": {
            k: plan.get(k)
            for k in (
                "method",
                "learning_rate",
                "lora_rank",
                "epochs",
                "effective_batch",
                "total_steps",
                "tokens_processed",
                "replay_added",
            )
        },  # fmt: skip
        "best_val_loss": report.get("best_val_loss"),
        "best_step": report.get("best_step"),
        "forgetting": report.get("forgetting"),
        "adapter_scale": {k: v for k, v in (report.get("adapter_scale") or {}).items() if k != "measured"} or None,
        "house_style": rate,
        "held_out_prompts": len(prompts),
        "retention": retention_row(run),
    }
    scale = (report.get("adapter_scale") or {}).get("value")
    if isinstance(scale, float) and scale < 1:
        row["retention_at_scale_1"] = retention_row(rescaled_copy(run, 1 / scale, "scale-1"))
    row["seconds"] = {"train": round(trained - started), "house_style": round(styled - trained),
                      "total": round(time.perf_counter() - started)}  # fmt: skip
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="smollm2-135m-instruct", help="a model folder or a known base's name")
    parser.add_argument("--points", default="auto", help=f"comma-separated, of: {', '.join(POINTS)}")
    parser.add_argument("--json", default="bench/retention_sweep_smollm2.json")
    parser.add_argument("--out", default="runs/retention_sweep", help="where the runs are kept")
    parser.add_argument("--resume", action="store_true", help="keep the points already in --json")
    parser.add_argument("--at-scale", default=None, metavar="RUN:X", help="check a finished run's adapter at X")
    args = parser.parse_args()
    if args.at_scale:
        run, scale = args.at_scale.rsplit(":", 1)
        print(json.dumps(at_scale(Path(run), float(scale))))
        return 0

    from finetune.models.bases import converted
    from finetune.models.known_bases import find_base

    known = find_base(args.base) if not Path(args.base).exists() else None
    model_dir = converted(known) if known else Path(args.base)
    results_path = Path(args.json)
    results = json.loads(results_path.read_text()) if args.resume and results_path.exists() else {"points": []}
    results["base"] = str(args.base)
    done = {row["name"] for row in results["points"]}
    for name in args.points.split(","):
        if name in done:
            continue
        row = run_point(name, POINTS[name], Path(model_dir), Path(args.out))
        results["points"].append(row)
        results_path.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps({k: row[k] for k in ("name", "best_val_loss", "house_style", "retention")}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
