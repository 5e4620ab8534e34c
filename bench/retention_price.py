"""Retention at the team's price: which values keep what the base knew, at the team's own price.

    nice -n 10 python bench/retention_price.py train --points replay-0.25,replay-0.25-soft [--resume]
    nice -n 10 python bench/retention_price.py measure --points replay-0.25,replay-0.25-soft [--resume] [--earliest]
    python bench/retention_price.py table            # the markdown tables of bench/AUTO.md from --json

Every point is the demo's run on a real base (examples/train.jsonl, 330 trained conversations, every value Auto's)
with only the named values set; the adapter scale is Auto's. `train` trains the points whose run folder has no
report.json yet (a stopped run resumes from its checkpoint) and keeps every checkpoint. `measure` scores each trained
point as the issues ask: optimizer steps (and their ratio to the team-only run's), the tokens billed (the team's file
x epochs) and trained, training time, the kept model's validation loss, house style on the 60 held-out prompts (the
demo's measure; with the team's system message when the run trained with one), and `finetune eval RUN --retention`
(accuracy, rule pass-rate, multiple choice, instruction following strict and per instruction, per instruction kind
with its interval, the team's voice in general answers, KL to the base, the flag), at the kept scale. `--at-scale-1`
also scores the adapter as trained; `--earliest` the earliest checkpoint that fits, as trained and at the kept scale.
Rows are written to --json as they finish; --resume keeps the rows (and measurements) already there. The general set
is the check's; nothing here chooses from it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from retention_sweep import EXAMPLES, house_style, rescaled_copy, retention_row  # noqa: E402
from retention_table import retention_table  # noqa: E402

KEEP_ALL = 100  # checkpoints kept: every evaluation's, for the earliest checkpoint that fits
TEAM_ONLY = "replay-0"  # the team's own run: the price's yardstick (steps)
POINTS: dict[str, dict] = {  # name -> the RunConfig values it sets; everything else is Auto's
    "replay-0": {"replay": "off"},
    "replay-0.05": {"replay": 0.05},
    "replay-0.1": {"replay": 0.1},
    "replay-0.25": {"replay": 0.25},  # Auto today
    "replay-0.5": {"replay": 0.5},
    "replay-1": {"replay": 1.0},
    "replay-0.25-lr-half": {"replay": 0.25, "lr_multiplier": 0.5},
    "replay-0.25-epochs-2": {"replay": 0.25, "epochs": 2},
    "replay-0-epochs-2": {"replay": "off", "epochs": 2},
    "replay-0.25-upper-half": {"replay": 0.25},  # and LoRA on the upper half of the blocks only (UPPER_HALF)
    "replay-0.25-soft": {"replay": 0.25, "replay_targets": "soft"},
    "replay-0.1-soft": {"replay": 0.1, "replay_targets": "soft"},
    "replay-0.25-team-system": {"replay": 0.25, "team_system": "TEAM"},
    "replay-0.25-soft-team-system": {"replay": 0.25, "replay_targets": "soft", "team_system": "TEAM"},
    "replay-0.25-rank-4": {"replay": 0.25, "lora_rank": 4},  # LoRA forgets less at lower ranks (Biderman et al. 2024)
}
UPPER_HALF = {"replay-0.25-upper-half"}  # the lower half of the blocks frozen: no adapter there (a bench-only patch)
PLAN_KEYS = ("method", "learning_rate", "lora_rank", "epochs", "effective_batch", "total_steps", "tokens_processed",
             "tokens_trained", "replay_added")  # fmt: skip


def base_folder(name: str) -> Path:
    from finetune.models.bases import converted
    from finetune.models.known_bases import find_base

    known = find_base(name) if not Path(name).exists() else None
    return Path(converted(known)) if known else Path(name)


def team_system() -> str:
    """The team's system message for the bound points: the one the team's own conversations carry most often."""
    from collections import Counter

    rows = [json.loads(line) for line in (EXAMPLES / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    systems = Counter(r["messages"][0]["content"] for r in rows if r["messages"][0]["role"] == "system")
    return systems.most_common(1)[0][0]


def values(name: str) -> dict:
    return {k: team_system() if v == "TEAM" else v for k, v in POINTS[name].items()}


def train_point(name: str, model_dir: Path, out: Path) -> None:
    from finetune.run import train
    from finetune.settings.config import RunConfig

    run = out / name
    if (run / "report.json").is_file():
        return
    resume = (run / "checkpoints").is_dir() and any((run / "checkpoints").iterdir())
    if run.exists() and not resume:
        shutil.rmtree(run)
    config = RunConfig(
        data=str(EXAMPLES / "train.jsonl"), model=str(model_dir), out=str(run), keep_checkpoints=KEEP_ALL,
        adapter_scale="auto", resume=resume, **values(name),
    )  # fmt: skip
    started = time.perf_counter()
    with _upper_half_only(name in UPPER_HALF):
        train(config)
    seconds = (
        json.loads((run / "bench_seconds.json").read_text())
        if resume and (run / "bench_seconds.json").is_file()
        else {}
    )
    total = seconds.get("train_and_scale", 0) + round(time.perf_counter() - started)
    (run / "bench_seconds.json").write_text(json.dumps({"train_and_scale": total, "resumed": resume}))


@contextlib.contextmanager
def _upper_half_only(on: bool):
    """LoRA on the upper half of the blocks only (PEFT's layers_to_transform), the lower half left as the base had
    it: what freezing the lower layers would be, measured here before it is a setting."""
    if not on:
        yield
        return
    from peft import LoraConfig

    model_module = importlib.import_module("finetune.train.model")

    real = model_module.add_lora

    def add_lora(model, *args, **kwargs):
        layers = model.config.num_hidden_layers
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"})
        linear = [n for n in linear if n != "lm_head"]  # "all-linear" cannot name layers: the same modules, listed
        original = LoraConfig.__init__

        def init(self, *a, **k):
            k |= {"target_modules": linear, "layers_to_transform": list(range(layers // 2, layers))}
            original(self, *a, **k)

        LoraConfig.__init__ = init
        try:
            return real(model, *args, **kwargs)
        finally:
            LoraConfig.__init__ = original

    model_module.add_lora = add_lora
    try:
        yield
    finally:
        model_module.add_lora = real


def _demo_prompts():
    from finetune.data.read import read_file

    style = json.loads((EXAMPLES / "house_style.json").read_text())
    return read_file(str(EXAMPLES / "test.jsonl")).conversations, [style["greeting"], style["sign_off"]]


def _scored(run: Path) -> dict:
    """House style and the retention check of one model folder, each with its wall time."""
    prompts, markers = _demo_prompts()
    started = time.perf_counter()
    style = house_style(run, prompts, markers)
    styled = time.perf_counter()
    retention = retention_row(run)
    seconds = {"house_style": round(styled - started), "retention": round(time.perf_counter() - styled)}
    return {"house_style": style, "retention": retention, "measure_seconds": seconds}


def measure_point(name: str, out: Path, at_scale_1: bool = False) -> dict:
    run = out / name
    plan = json.loads((run / "plan.json").read_text())
    report = json.loads((run / "report.json").read_text())
    scale = report.get("adapter_scale") or {}
    bench_seconds = (
        json.loads((run / "bench_seconds.json").read_text()) if (run / "bench_seconds.json").is_file() else {}
    )
    row = {
        "name": name,
        "values": POINTS[name],
        "plan": {k: plan.get(k) for k in PLAN_KEYS},
        "team_steps": _team_only_steps(plan),
        "tokens_billed": report.get("tokens_processed"),  # the team's file x epochs (replay rows are not billed)
        "tokens_trained": report.get("tokens_trained", report.get("tokens_processed")),
        "general_val_set": {
            k: (plan.get("general_val_set") or {}).get(k) for k in ("answers", "cached", "generation_s")
        },
        "best_val_loss": report.get("best_val_loss"),
        "best_step": report.get("best_step"),
        "kept_scale": scale.get("value"),
        "kept_val_loss": _kept_val_loss(report),
        "kept_general_loss": _kept_val_loss(report, "general_loss"),  # the held-out replay slice: for choosing
        "train_seconds": report.get("wall_time_s"),
        "train_and_scale_seconds": bench_seconds.get("train_and_scale"),
        **_scored(run),
    }
    if at_scale_1 and isinstance(scale.get("value"), float) and scale["value"] < 1:
        unscaled = rescaled_copy(run, 1 / scale["value"], "scale-1")
        row["at_scale_1"] = _scored(unscaled)
    return row


def _team_only_steps(plan: dict) -> int:
    """The steps the same run takes on the team's rows alone: the price's yardstick."""
    team_rows = (plan.get("replay_added") or {}).get("team_rows") or plan["conversations"]
    return -(-team_rows // plan["effective_batch"]) * plan["epochs"]


def earliest_fit(run: Path) -> tuple[int, float] | None:
    """(the first evaluated step whose validation loss is within the adapter scale's band of the best, its loss):
    the earliest checkpoint that fits (every checkpoint is kept by `train`)."""
    from finetune.report.metrics import read_metrics
    from finetune.rules.adapter_scale import tolerance

    val = [(r["step"], r["val_loss"]) for r in read_metrics(run / "metrics.jsonl") if r.get("val_loss") is not None]
    if not val:
        return None
    best = min(v for _, v in val)
    return next((step, v) for step, v in val if v <= best + tolerance(best))


def checkpoint_copy(run: Path, step: int, scale: float = 1.0) -> Path:
    """A copy of the run (checkpoints left out) whose adapter is the checkpoint of `step`, scaled by `scale`."""
    copy = run.with_name(f"{run.name}-step-{step}" + (f"-scale-{scale:g}" if scale != 1 else ""))
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy2(run / "checkpoints" / f"step-{step:06d}" / name, copy / "adapter" / name)
    config_path = copy / "adapter" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["lora_alpha"] = config["lora_alpha"] * scale  # the output layer is tied on SmolLM2: alpha is the scale
    config_path.write_text(json.dumps(config, indent=2))
    return copy


def measure_earliest(name: str, out: Path, scale: float = 1.0) -> dict | None:
    run = out / name
    found = earliest_fit(run)
    if found is None:
        return None
    step, val_loss = found
    return {"step": step, "val_loss": val_loss, "scale": scale, **_scored(checkpoint_copy(run, step, scale))}


def _kept_val_loss(report: dict, key: str = "val_loss") -> float | None:
    """The validation loss (or the general probe's, `general_loss`) of the adapter the run keeps, at the kept scale
    when Auto measured one."""
    scale = report.get("adapter_scale") or {}
    for measured in scale.get("measured") or []:
        if measured.get("alpha") == scale.get("value"):
            return measured.get(key)
    return report.get("best_val_loss") if key == "val_loss" else None


def _measure(names: list[str], out: Path, args) -> None:
    path = Path(args.json)
    results = json.loads(path.read_text()) if args.resume and path.exists() else {"base": args.base, "points": []}
    rows = {row["name"]: row for row in results["points"]}
    for name in names:
        if not (out / name / "report.json").is_file():
            continue
        if name not in rows:
            rows[name] = measure_point(name, out, args.at_scale_1)
            results["points"].append(rows[name])
        if args.earliest and "earliest_fit" not in rows[name]:
            rows[name]["earliest_fit"] = measure_earliest(name, out)
        kept = rows[name].get("kept_scale")
        if args.earliest and isinstance(kept, float) and kept < 1 and "earliest_fit_kept_scale" not in rows[name]:
            rows[name]["earliest_fit_kept_scale"] = measure_earliest(name, out, kept)
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"measured {name}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("phase", choices=("train", "measure", "table"))
    parser.add_argument("--points", default=",".join(POINTS), help=f"comma-separated, of: {', '.join(POINTS)}")
    parser.add_argument("--base", default="smollm2-135m-instruct", help="a model folder or a known base's name")
    parser.add_argument("--out", default="runs/retention_price", help="where the runs are kept")
    parser.add_argument("--json", default="bench/retention_price_smollm2.json")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --json")
    parser.add_argument("--earliest", action="store_true", help="measure: also the earliest checkpoint that fits")
    parser.add_argument("--at-scale-1", action="store_true", help="measure: also the adapter as trained")
    args = parser.parse_args()
    if args.phase == "table":
        print(retention_table(json.loads(Path(args.json).read_text())))
        return 0
    names = args.points.split(",")
    unknown = [n for n in names if n not in POINTS]
    if unknown:
        parser.error(f"unknown points: {', '.join(unknown)}")
    out = Path(args.out)
    if args.phase == "train":
        model_dir = base_folder(args.base)
        for name in names:
            train_point(name, model_dir, out)
            print(f"trained {name}", flush=True)
        return 0
    _measure(names, out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
