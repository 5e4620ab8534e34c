"""The path before training, at 1k / 10k / 100k conversations: time and peak memory of every stage.

    python bench/data_path.py [--sizes 1000 10000 100000] [--work /tmp/data-path] [--steps 12]

For each size it generates support-style conversations (bench/support_data.py, not committed), builds the
toy model once, and runs each stage as its own process, the way a user runs it:

    validate      finetune validate DATA --json
    plan cold     finetune plan DATA --model TOY --json        (empty token cache: reads and tokenizes)
    plan cached   the same again                               (reads the token cache)
    train         finetune's train() on the same data and cache, --max-steps N, batch 8:
                  time from the process start to the end of the first step, per step (median of the
                  step intervals), and from the end of the last step to the end of the run (export, report)

Memory is the peak, sampled every 0.5 s, of the proportional set size (PSS) summed over the process and its
children (the tokenizing workers): memory pages shared by forked workers are counted once, not per worker.
Reading PSS walks the page tables (~7-17 ms per process of ~0.5-1 GB): sampled every 0.1 s it took ~0.3 of
a core from the stage it measures on a 2-core machine, so the interval is 0.5 s.
The machine's load average is printed with each row: timings on a shared machine are only as good as it is
quiet. CPU seconds (user + system, the process and every worker it waited for) are printed too: on a busy
machine they are the steadier measure, and CPU seconds / cores is the wall time a quiet machine would give
a perfectly parallel stage. Needs psutil (pip install -e '.[bench]').
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SAMPLE_INTERVAL_S = 0.5


# ----------------------------------------------------------------------------- measuring one process tree


def _tree_memory(process) -> tuple[int, int]:
    """(PSS, RSS) in bytes, summed over `process` and its children; (0, 0) for what has exited."""
    import psutil

    pss = rss = 0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for member in members:
        try:
            info = member.memory_full_info()
            pss += getattr(info, "pss", info.rss)
            rss += info.rss
        except psutil.Error:
            continue
    return pss, rss


def measure(command: list[str], env: dict | None = None) -> dict:
    """Run `command`; its wall time, exit code, stdout, and peak memory of its process tree."""
    import psutil

    load_before = os.getloadavg()[0]
    used_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    process = psutil.Process(child.pid)
    peak = {"pss": 0, "rss": 0}

    def sample() -> None:
        while child.poll() is None:
            pss, rss = _tree_memory(process)
            peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)
            time.sleep(SAMPLE_INTERVAL_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - started
    used = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and the workers it waited for
    cpu = used.ru_utime - used_before.ru_utime + used.ru_stime - used_before.ru_stime
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{stderr[-3000:]}")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_pss_mb": peak["pss"] / 2**20,
        "peak_rss_mb": peak["rss"] / 2**20,
        "stdout": stdout,
        "load": (load_before, os.getloadavg()[0]),
    }


# ----------------------------------------------------------------------------- the train probe (a child process)


def train_probe(data: str, model: str, out: str, cache_dir: str, steps: int) -> None:
    """Runs in its own process: trains `steps` steps and prints the stage times as JSON."""
    import psutil

    born = psutil.Process().create_time()
    import importlib

    from finetune.settings.config import RunConfig

    recipe = importlib.import_module("finetune.run")  # `finetune.train` the attribute is the function

    seen: dict = {}
    real_prepare = recipe.prepare

    def prepare(*args, **kwargs):
        prepared = real_prepare(*args, **kwargs)
        seen["from_cache"] = prepared.from_cache
        seen["prepared_at"] = time.time() - born
        return prepared

    recipe.prepare = prepare
    step_times: list[float] = []
    config = RunConfig(
        data=data, model=model, out=out, cache_dir=cache_dir, max_steps=steps, batch_size=8, epochs=1, lr=1e-4,
        eval_every=10**6, save_every=10**6,  # one evaluation and one checkpoint, at the last step: steps stay steps
        replay="off", adapter_scale="off",  # the data path as measured before Auto's retention mechanisms
    )  # fmt: skip
    recipe.train(config, on_step=lambda row: step_times.append(time.time()))
    finished = time.time()
    intervals = sorted(b - a for a, b in zip(step_times, step_times[1:], strict=False))
    print(
        json.dumps(
            {
                "from_cache": seen.get("from_cache"),
                "data_ready_s": seen.get("prepared_at"),
                "first_step_s": step_times[0] - born,
                "per_step_s": intervals[len(intervals) // 2] if intervals else None,
                "after_last_step_s": finished - step_times[-1],
                "steps": len(step_times),
            }
        )
    )


# ----------------------------------------------------------------------------- the benchmark


def _finetune(*args: str) -> list[str]:
    return [sys.executable, "-m", "finetune", *args]


def run_size(size: int, work: Path, model: Path, steps: int, env: dict) -> dict:
    sys.path.insert(0, str(BENCH))
    from support_data import write_support_data

    data = work / f"support-{size}.jsonl"
    if not data.exists():
        write_support_data(data, size)
    cache_dir = work / f"cache-{size}"
    shutil.rmtree(cache_dir, ignore_errors=True)
    row: dict = {"conversations": size, "file_mb": data.stat().st_size / 1e6}

    def stage(name: str, command: list[str]) -> None:
        row[name] = measure(command, env)
        shown = {k: v for k, v in row[name].items() if k != "stdout"}
        print(json.dumps({"conversations": size, "stage": name, **shown}), flush=True)  # survives an interrupted run

    stage("validate", _finetune("validate", str(data), "--json"))
    plan_args = ("plan", str(data), "--model", str(model), "--json", "--cache-dir", str(cache_dir))
    stage("plan_cold", _finetune(*plan_args))
    stage("plan_cached", _finetune(*plan_args))
    plan = json.loads(row["plan_cached"]["stdout"])
    row["tokens"], row["examples"] = plan["tokens_in_file"], plan["examples"]
    out = work / f"run-{size}"
    shutil.rmtree(out, ignore_errors=True)
    probe = [sys.executable, __file__, "--train-probe", str(data), str(model), str(out), str(cache_dir), str(steps)]
    stage("train", probe)
    row["train"].update(json.loads(row["train"]["stdout"].strip().splitlines()[-1]))
    for stage in ("validate", "plan_cold", "plan_cached", "train"):
        row[stage].pop("stdout", None)
    return row


def render(rows: list[dict]) -> str:
    head = (
        "| conversations | file | tokens | validate | plan cold | plan cached | first step | per step "
        "| after last step | load (1 min) |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        t = r["train"]

        def cell(stage: dict) -> str:
            return f"{stage['wall_s']:.1f} s (cpu {stage['cpu_s']:.0f} s), {stage['peak_pss_mb']:,.0f} MB"

        loads = [v for stage in ("validate", "plan_cold", "plan_cached", "train") for v in r[stage]["load"]]
        lines.append(
            f"| {r['conversations']:,} | {r['file_mb']:.0f} MB | {r['tokens'] or 0:,} | {cell(r['validate'])} "
            f"| {cell(r['plan_cold'])} | {cell(r['plan_cached'])} "
            f"| {t['first_step_s']:.1f} s{'' if t['from_cache'] else ' (not cached!)'}, {t['peak_pss_mb']:,.0f} MB "
            f"| {t['per_step_s'] * 1000:.0f} ms | {t['after_last_step_s']:.1f} s "
            f"| {min(loads):.1f}-{max(loads):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--train-probe":
        data, model, out, cache_dir, steps = argv[1:6]
        train_probe(data, model, out, cache_dir, int(steps))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--work", default="/tmp/finetune-data-path", help="where data, cache and runs go")
    parser.add_argument("--steps", type=int, default=12, help="training steps per size")
    args = parser.parse_args(argv)

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env["TOKENIZERS_PARALLELISM"] = "false"
    model = work / "toy"
    if not (model / "config.json").exists():
        subprocess.run(_finetune("toy-model", str(model)), check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)

    rows = []
    for size in args.sizes:
        rows.append(run_size(size, work, model, args.steps, env))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\ncores: {len(os.sched_getaffinity(0))}  python: {sys.version.split()[0]}")
    print(render(rows))
    (work / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
