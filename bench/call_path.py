"""How much of finetune's own code runs between `finetune train` and the first optimizer step (issue 32).

Runs `finetune train` in-process on the toy model and the bundled examples, with a fresh cache (a first run:
nothing tokenized, no speed measured yet), and counts every call of a function defined in the finetune package
until torch's AdamW takes its first step (its `step` is Adam's) in the training loop. Prints calls, distinct
functions, distinct modules, and how many times the model was loaded (`from_pretrained` of a causal LM);
`--by-module` adds where the calls go (calls per module, and the busiest functions).

    python bench/call_path.py [--json] [--by-module] [--top N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = str(REPO / "finetune")


def _from_the_loop(frame) -> bool:
    """An optimizer step the training loop takes (a speed probe's steps do not count as the run's first)."""
    for _ in range(12):
        frame = frame.f_back
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(os.path.join("train", "loop.py")):
            return True
    return False


def count(model: str, data: str) -> tuple[dict, Counter[str]]:
    """The totals, and the calls of each function (`path/in/finetune.py:qualified.name`)."""
    calls: Counter[str] = Counter()
    modules: set[str] = set()
    loads = 0

    def profile(frame, event, arg):
        nonlocal loads
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(PACKAGE):
            calls[f"{code.co_filename[len(PACKAGE) + 1 :]}:{code.co_qualname}"] += 1
            modules.add(code.co_filename)
        elif code.co_name == "from_pretrained" and code.co_filename.endswith("auto_factory.py"):
            loads += 1
        elif code.co_name == "step" and code.co_filename.endswith("optim/adam.py") and _from_the_loop(frame):
            sys.setprofile(None)  # counted up to here; the run goes on unobserved

    from finetune.commands.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FINETUNE_CACHE"] = str(Path(tmp) / "cache")
        argv = ["train", data, "--model", model, "--out", str(Path(tmp) / "run"), "--epochs", "1"]
        sys.setprofile(profile)
        try:
            main(argv)
        finally:
            sys.setprofile(None)
    loader = [name for name in calls if name.endswith(":load_model")]
    totals = {
        "calls": sum(calls.values()),
        "functions": len(calls),
        "modules": len(modules),
        "from_pretrained": loads,
        "load_model": sum(calls[name] for name in loader),
    }
    return totals, calls


def by_module(calls: Counter[str]) -> Counter[str]:
    """Calls per module (`data/prepare.py`)."""
    modules: Counter[str] = Counter()
    for name, n in calls.items():
        modules[name.partition(":")[0]] += n
    return modules


def breakdown(calls: Counter[str], top: int) -> str:
    """Calls per module, busiest first, each with its busiest functions."""
    total = sum(calls.values()) or 1
    lines = []
    for module, n in by_module(calls).most_common():
        lines.append(f"{n:>8} {100 * n / total:5.1f}%  {module}")
        functions = Counter({k.partition(":")[2]: v for k, v in calls.items() if k.partition(":")[0] == module})
        lines += [f"{v:>17}  {name}" for name, v in functions.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--by-module", action="store_true", help="where the calls go: per module and function")
    parser.add_argument("--top", type=int, default=3, help="functions shown per module with --by-module")
    parser.add_argument("--data", default=str(REPO / "examples" / "train.jsonl"))
    args = parser.parse_args()
    from finetune.ship.toy import build_toy_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "toy")
        build_toy_model(model)
        result, calls = count(model, args.data)
    if args.json:
        modules = dict(by_module(calls).most_common()) if args.by_module else None
        print(json.dumps(result | ({"by_module": modules} if modules else {})))
        return
    print("\n".join(f"{k}: {v}" for k, v in result.items()))
    if args.by_module:
        print("\ncalls by module (and its busiest functions):\n" + breakdown(calls, args.top))


if __name__ == "__main__":
    main()
