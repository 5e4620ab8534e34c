"""bf16 against fp32 on SmolLM2-135M-Instruct: the demo's run twice, the same settings but the precision.

    .venv/bin/python bench/precision_smollm2.py --out bench/precision_smollm2.json   # ~1.5 h on 2 shared cores
    .venv/bin/python bench/precision_smollm2.py --max-steps 0 --replay auto          # the demo's whole Auto run

For each precision (Auto's choice on this machine, then `--dtype fp32`): `finetune.train` on the bundled support
conversations, every other value Auto's except what the flags set (by default the run is cut to `--max-steps 60`
of its 126, and self-replay, the forgetting curve and the adapter scale are off, to fit both runs in the time a
shared 2-core machine gives: their generation would double it); the held-out prompts answered by the tuned model
(house style: the exact greeting and sign-off); and the retention check (both sides from a cold cache: a precision
is part of the answers' cache key). Written: each run's loss curves (train,
validation, forgetting curve), house style, the retention verdict with every measure, and the seconds of each stage
with the machine's load before and after it; then the differences, each against its stated tolerance:

    loss curves       |val_loss(bf16) - val_loss(fp32)| at every evaluation <= 0.02 (relative), final train loss too
    house style       the tuned model's rate within 10 points (held-out prompts: 1 prompt is 2-3 points)
    retention         the same verdict (flag and the measures flagged), each measure's change within 5 points
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOLERANCE = {"val_loss_relative": 0.02, "house_style_points": 10, "retention_change_points": 5}


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def one_run(dtype: str, work: Path, base: str, settings: dict) -> dict:
    import torch

    from finetune.commands.demo import MAX_NEW_TOKENS, _load_examples
    from finetune.placement.where import of_run
    from finetune.run import train
    from finetune.settings.config import RunConfig
    from finetune.ship.eval.generate import generate_answers, style_rate
    from finetune.ship.eval.retention import MEASURES, check_retention
    from finetune.ship.run_folder import load_for_generation, locate_weights
    from finetune.ship.toy import DEMO_DATA

    out = work / dtype / "run"
    prompts, markers = _load_examples()
    stages = {}
    started, before = time.perf_counter(), load()
    result = train(RunConfig(data=str(DEMO_DATA / "train.jsonl"), model=base, out=str(out), dtype=dtype, **settings))
    stages["train"] = {"seconds": round(time.perf_counter() - started), "load_before": before, "load_after": load()}
    started, before = time.perf_counter(), load()
    model, tokenizer = load_for_generation(locate_weights(out))
    answers = generate_answers(model, tokenizer, prompts, max_new_tokens=MAX_NEW_TOKENS)
    del model
    stages["answers"] = {"seconds": round(time.perf_counter() - started), "load_before": before, "load_after": load()}
    started, cpu, before = time.perf_counter(), time.process_time(), load()
    retention = check_retention(out)
    stages["retention"] = {"seconds": round(time.perf_counter() - started), "load_before": before, "load_after": load(),
                           "cpu_seconds": round(time.process_time() - cpu), "threads": torch.get_num_threads(),
                           "base_cached": retention["seconds"]["base_cached"]}  # fmt: skip
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    plan = json.loads((out / "plan.json").read_text())
    return {
        "dtype": plan["dtype"],
        "placement": of_run(out).to_dict(),
        "auto_dtype": plan["auto"].get("dtype"),
        "steps": result.report.get("steps_taken"),
        "curves": {
            key: {row["step"]: row[key] for row in rows if row.get(key) is not None}
            for key in ("train_loss", "val_loss", "general_val_loss")
        },
        "final_train_loss": result.report.get("final_train_loss"),
        "best_val_loss": result.report.get("best_val_loss"),
        "adapter_scale": (result.report.get("adapter_scale") or {}).get("value"),
        "replay": (plan.get("replay_added") or {}).get("generated"),
        "house_style": style_rate(answers, markers),
        "answers": answers,
        "retention": {
            "flag": retention["flag"],
            "flagged": retention["flagged"],
            "message": retention["message"],
            "measures": {
                k: {
                    "base": retention[k]["base"]["rate"],
                    "tuned": retention[k]["tuned"]["rate"],
                    "change": retention[k]["change"],
                }
                for k in MEASURES
            },  # fmt: skip
            "kl": retention["kl"]["mean_per_token"],
            "seconds": retention["seconds"],
        },
        "stages": stages,
    }


def compare(bf16: dict, fp32: dict) -> dict:
    val = {s: (bf16["curves"]["val_loss"][s], fp32["curves"]["val_loss"][s]) for s in fp32["curves"]["val_loss"]
           if s in bf16["curves"]["val_loss"]}  # fmt: skip
    worst_val = max(abs(a - b) / b for a, b in val.values())
    style = abs(bf16["house_style"] - fp32["house_style"]) * 100
    changes = {k: abs(bf16["retention"]["measures"][k]["change"]["value"] - v["change"]["value"]) * 100
               for k, v in fp32["retention"]["measures"].items()}  # fmt: skip
    same_verdict = (bf16["retention"]["flag"], bf16["retention"]["flagged"]) == (
        fp32["retention"]["flag"], fp32["retention"]["flagged"])  # fmt: skip
    return {
        "val_loss_worst_relative": worst_val,
        "final_train_loss": [bf16["final_train_loss"], fp32["final_train_loss"]],
        "house_style_points": style,
        "retention_same_verdict": same_verdict,
        "retention_change_points": changes,
        "within_tolerance": worst_val <= TOLERANCE["val_loss_relative"]
        and style <= TOLERANCE["house_style_points"]
        and same_verdict
        and max(changes.values()) <= TOLERANCE["retention_change_points"],
        "tolerance": TOLERANCE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "precision_smollm2.json"))
    parser.add_argument("--work", default="/tmp/finetune-precision-smollm2")
    parser.add_argument("--max-steps", type=int, default=60, help="0: the whole run Auto plans")
    parser.add_argument("--dtypes", default="auto,fp32", help="the runs to make (each saved as WORK/DTYPE/result.json)")
    parser.add_argument("--replay", default="off", help="off, or auto: self-replay, the forgetting curve and the "
                        "adapter scale as Auto chooses them")  # fmt: skip
    args = parser.parse_args()
    settings = {"max_steps": args.max_steps or None}
    if args.replay == "off":
        settings |= {"replay": "off", "general_val": False, "adapter_scale": "off"}
    from finetune.models.bases import pull

    base = str(pull("smollm2-135m-instruct", log=print))
    work = Path(args.work)
    for dtype in args.dtypes.split(","):
        result = one_run(dtype, work, base, settings)
        (work / dtype / "result.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
        print(json.dumps({k: v for k, v in result.items() if k not in ("answers", "curves")}, indent=1), flush=True)
    if not all((work / dtype / "result.json").is_file() for dtype in ("auto", "fp32")):
        return  # the other run is made by another invocation (--dtypes): the comparison once both are there
    runs = {dtype: json.loads((work / dtype / "result.json").read_text()) for dtype in ("auto", "fp32")}
    document = {
        "settings": settings,
        "runs": runs,
        "comparison": compare(runs["auto"], runs["fp32"]),
        "machine": load(),
    }
    Path(args.out).write_text(json.dumps(document, indent=1, ensure_ascii=False))
    print(json.dumps(document["comparison"], indent=1))


if __name__ == "__main__":
    main()
