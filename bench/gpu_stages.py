"""Where each stage of a run ran, from its stages.jsonl files: device, precision, seconds, peak GPU memory.

    python bench/gpu_stages.py runs/demo                 # the demo folder: its own stages and its run's
    python bench/gpu_stages.py runs/demo --json out.json

Reads FOLDER/stages.jsonl and FOLDER/run/stages.jsonl (finetune/placement/stages.py writes a line per stage: the
demo's base and tuned answers, the base's answers for self-replay and the forgetting curve, training, the adapter
scale, each side of the retention check) and the run's plan.json (its device and precision). Exits 1 when a model of
any stage sat on the CPU, or when no stage was recorded: bench/gpu_demo.sh's check that a GPU run is a GPU run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def stages_of(folder: Path) -> list[dict]:
    found = []
    for path in (folder / "stages.jsonl", folder / "run" / "stages.jsonl"):
        if path.is_file():
            found += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return found


def placement_of(folder: Path) -> dict:
    for plan in (folder / "run" / "plan.json", folder / "plan.json"):
        if plan.is_file():
            document = json.loads(plan.read_text(encoding="utf-8"))
            return {
                "device": document.get("device"),
                "dtype": document.get("dtype"),
                "why": document["auto"].get("dtype"),
            }
    return {}


def on_cpu(stage: dict) -> bool:
    return any(device == "cpu" for device in stage["devices"])


def report(folder: Path) -> tuple[str, dict, bool]:
    stages, placement = stages_of(folder), placement_of(folder)
    lines = [f"plan: device {placement.get('device')}, precision {placement.get('dtype')} ({placement.get('why')})", ""]
    lines.append(f"{'stage':<24} {'devices':<14} {'precision (parameters)':<40} {'seconds':>8} {'peak GPU MiB':>13}")
    for stage in stages:
        dtypes = ", ".join(f"{name} {count:,}" for name, count in stage["dtypes"].items())
        peak = stage.get("peak_gpu_bytes")
        lines.append(
            f"{stage['stage']:<24} {','.join(stage['devices']):<14} {dtypes:<40} {stage['seconds']:>8.1f} "
            f"{'-' if peak is None else f'{peak / 2**20:,.0f}':>13}" + ("   <- ON THE CPU" if on_cpu(stage) else "")
        )
    ok = bool(stages) and not any(on_cpu(stage) for stage in stages)
    lines += [
        "",
        "every model of the run on the GPU" if ok else "FAILED: a model of the run sat on the CPU (or no stage)",
    ]
    return "\n".join(lines), {"placement": placement, "stages": stages, "all_on_gpu": ok}, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the demo's --out folder (or a run folder)")
    parser.add_argument("--json", type=Path, help="also write the stages and the verdict here")
    args = parser.parse_args(argv)
    text, document, ok = report(args.folder)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(document, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
