"""Retention at the team's price: how little replay (and which other values) keep what the base knew.

    nice -n 5 python bench/retention_price.py train --points replay-0,replay-0.25 [--resume]
    nice -n 5 python bench/retention_price.py measure --points replay-0,replay-0.25 [--resume]

Every point is the demo's run on a real base (examples/train.jsonl, 330 trained conversations, every value Auto's)
with only the named values set; the adapter scale is Auto's (so one run gives the adapter as trained, scale 1, and
the scale Auto keeps). `train` trains the points whose run folder has no report.json yet (a stopped run resumes
from its checkpoint) and keeps every checkpoint, so the earliest checkpoint that fits can be measured later.
`measure` (with --earliest, also the earliest checkpoint that fits) scores each trained point as the issue asks: optimizer steps, the tokens billed (the team's file x
epochs) and the tokens the run trained on, training time, the kept model's best validation loss, house style on
the 60 held-out prompts (the demo's measure), and `finetune eval RUN --retention` (accuracy, rule pass-rate,
multiple choice, instruction following, the team's voice in general answers, KL to the base), at the kept scale
and, when Auto kept less than 1, at scale 1 too. Rows are written to --json as they finish; --resume keeps the
rows (and measurements) already there. The general set is the check's; nothing here chooses from it.
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

KEEP_ALL = 100  # checkpoints kept: every evaluation's, for the earliest checkpoint that fits
POINTS: dict[str, dict] = {  # name -> the RunConfig values it sets; everything else is Auto's
    "replay-0": {"replay": "off"},
    "replay-0.05": {"replay": 0.05},
    "replay-0.1": {"replay": 0.1},
    "replay-0.25": {"replay": 0.25},
    "replay-0.5": {"replay": 0.5},
    "replay-1": {"replay": 1.0},
    "replay-0.25-lr-half": {"replay": 0.25, "lr_multiplier": 0.5},
    "replay-0.25-epochs-2": {"replay": 0.25, "epochs": 2},
    "replay-0-epochs-2": {"replay": "off", "epochs": 2},
    "replay-0.25-upper-half": {"replay": 0.25},  # and LoRA on the upper half of the blocks only (UPPER_HALF)
}
UPPER_HALF = {"replay-0.25-upper-half"}  # the lower half of the blocks frozen: no adapter there (a bench-only patch)
PLAN_KEYS = ("method", "learning_rate", "lora_rank", "epochs", "effective_batch", "total_steps", "tokens_processed",
             "tokens_trained", "replay_added")  # fmt: skip


def base_folder(name: str) -> Path:
    from finetune.models.bases import converted
    from finetune.models.known_bases import find_base

    known = find_base(name) if not Path(name).exists() else None
    return Path(converted(known)) if known else Path(name)


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
        adapter_scale="auto", resume=resume, **POINTS[name],
    )  # fmt: skip
    started = time.perf_counter()
    with _upper_half_only(name in UPPER_HALF):
        train(config)
    (run / "bench_seconds.json").write_text(json.dumps({"train_and_scale": round(time.perf_counter() - started)}))


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


def measure_point(name: str, out: Path) -> dict:
    run = out / name
    plan = json.loads((run / "plan.json").read_text())
    report = json.loads((run / "report.json").read_text())
    prompts, markers = _demo_prompts()
    scale = report.get("adapter_scale") or {}
    row = {
        "name": name,
        "values": POINTS[name],
        "plan": {k: plan.get(k) for k in PLAN_KEYS},
        "tokens_billed": report.get("tokens_processed"),  # the team's file x epochs (replay rows are not billed)
        "tokens_trained": report.get("tokens_trained", report.get("tokens_processed")),
        "general_val_set": {
            k: (plan.get("general_val_set") or {}).get(k) for k in ("answers", "cached", "generation_s")
        },
        "best_val_loss": report.get("best_val_loss"),
        "best_step": report.get("best_step"),
        "kept_scale": scale.get("value"),
        "kept_val_loss": _kept_val_loss(report),
        "train_seconds": report.get("wall_time_s"),
        "house_style": house_style(run, prompts, markers),
        "retention": retention_row(run),
    }
    if isinstance(scale.get("value"), float) and scale["value"] < 1:
        unscaled = rescaled_copy(run, 1 / scale["value"], "scale-1")
        row["at_scale_1"] = {"house_style": house_style(unscaled, prompts, markers),
                             "retention": retention_row(unscaled)}  # fmt: skip
    return row


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


def checkpoint_copy(run: Path, step: int) -> Path:
    """A copy of the run (checkpoints left out) whose adapter is the checkpoint of `step`, as trained (unscaled)."""
    copy = run.with_name(f"{run.name}-step-{step}")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy2(run / "checkpoints" / f"step-{step:06d}" / name, copy / "adapter" / name)
    return copy


def measure_earliest(name: str, out: Path) -> dict | None:
    run = out / name
    found = earliest_fit(run)
    if found is None:
        return None
    step, val_loss = found
    copy = checkpoint_copy(run, step)
    prompts, markers = _demo_prompts()
    return {"step": step, "val_loss": val_loss, "house_style": house_style(copy, prompts, markers),
            "retention": retention_row(copy)}  # fmt: skip


def _kept_val_loss(report: dict) -> float | None:
    """The validation loss of the adapter the run keeps: at the kept scale when Auto measured one."""
    scale = report.get("adapter_scale") or {}
    for measured in scale.get("measured") or []:
        if measured.get("alpha") == scale.get("value"):
            return measured.get("val_loss")
    return report.get("best_val_loss")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("phase", choices=("train", "measure"))
    parser.add_argument("--points", default=",".join(POINTS), help=f"comma-separated, of: {', '.join(POINTS)}")
    parser.add_argument("--base", default="smollm2-135m-instruct", help="a model folder or a known base's name")
    parser.add_argument("--out", default="runs/retention_price", help="where the runs are kept")
    parser.add_argument("--json", default="bench/retention_price_smollm2.json")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --json")
    parser.add_argument("--earliest", action="store_true", help="measure: also the earliest checkpoint that fits")
    args = parser.parse_args()
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
    path = Path(args.json)
    results = json.loads(path.read_text()) if args.resume and path.exists() else {"base": args.base, "points": []}
    rows = {row["name"]: row for row in results["points"]}
    for name in names:
        if not (out / name / "report.json").is_file():
            continue
        if name not in rows:
            rows[name] = measure_point(name, out)
            results["points"].append(rows[name])
        if args.earliest and "earliest_fit" not in rows[name]:
            rows[name]["earliest_fit"] = measure_earliest(name, out)
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"measured {name}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
