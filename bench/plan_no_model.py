"""`finetune plan` on a real base loads no model and generates nothing (issue 49): its time from an empty cache.

    python bench/plan_no_model.py [--base smollm2-135m-instruct] [--runs 3] [--out bench/plan_no_model.json]

Each run is `finetune plan examples/train.jsonl --model BASE --json` as its own process, in a cache root of its own
that holds the pulled base (`finetune base pull BASE` first: its GGUF and its conversion, linked from the usual cache)
and nothing else: no replay answers, no forgetting-curve answers, no token cache, no known speed. The process runs
with transformers' `AutoModelForCausalLM.from_pretrained` replaced by a function that fails, so a plan that loaded
the model's weights would fail here. Printed and written: the wall time of each run, the load average around it,
its CPU seconds (the steadier measure on a shared machine), what the plan says self-replay and the forgetting curve
will cost (counted, not generated) and its step count.
Target: <= 10 s (before issue 49 the same plan answered the replay and forgetting-curve prompts: minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINKED = ("bases", "gguf", "hashes")  # the pulled base and its conversion; nothing the plan would fill
PLAN = """
import sys
import transformers

def refuse(*args, **kwargs):
    raise SystemExit("a model's weights were loaded while planning")

transformers.AutoModelForCausalLM.from_pretrained = refuse
from finetune.commands.cli import main
sys.exit(main(sys.argv[1:]))
"""


def one_run(base: str, data: Path, usual: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="plan-no-model-") as root:
        for name in LINKED:
            if (usual / name).exists():
                os.symlink(usual / name, Path(root) / name)
        env = {**os.environ, "FINETUNE_CACHE": root, "PYTHONPATH": str(REPO)}
        load = os.getloadavg()[0]
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", PLAN, "plan", str(data), "--model", base, "--json"],
            env=env, capture_output=True, text=True, cwd=REPO,
        )  # fmt: skip
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime
        if done.returncode != 0:
            raise SystemExit(f"the plan failed ({done.returncode}):\n{done.stderr[-3000:]}")
        left = sorted(p.name for p in Path(root).iterdir() if p.name not in LINKED)
    plan = json.loads(done.stdout)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),  # the process's CPU seconds: the steadier measure on a shared machine
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "total_steps": plan["total_steps"],
        "replay_added": plan.get("replay_added"),
        "general_val_set": plan.get("general_val_set"),
        "cache_folders_written": left,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    usual = Path(os.environ.get("FINETUNE_CACHE") or Path.home() / ".cache" / "finetune")
    if not (usual / "bases").exists():
        raise SystemExit(f"pull the base first: finetune base pull {args.base}")
    tmp_before = {p.name for p in Path(tempfile.gettempdir()).glob("finetune-*")}
    runs = [one_run(args.base, REPO / "examples" / "train.jsonl", usual) for _ in range(args.runs)]
    tmp_left = sorted({p.name for p in Path(tempfile.gettempdir()).glob("finetune-*")} - tmp_before)
    result = {
        "command": f"finetune plan examples/train.jsonl --model {args.base} --json (empty cache, no model loadable)",
        "cores": len(os.sched_getaffinity(0)),
        "runs": runs,
        "wall_s": [r["wall_s"] for r in runs],
        "cpu_s": [r["cpu_s"] for r in runs],
        "left_in_tmp": tmp_left,
        "target_s": 10,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
