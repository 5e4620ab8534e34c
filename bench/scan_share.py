"""The scans' share of a cold plan of 100,000 support conversations (issue 49), and the invented-specifics scan
before and after its fast path.

    python bench/scan_share.py [--conversations 100000] [--sample 10000] [--work /tmp/scan-share] [--out FILE]

1. `finetune plan DATA --model TOY --json`, cold (an empty token cache), as its own process: wall time and CPU seconds
   (the process and the tokenizing workers it waited for), as bench/data_path.py measures it.
2. The scans alone, in this process, over the same file: reading it, the sensitive-data scan, and both scans in the one
   pass the data path makes (`invented.scan_both`): CPU seconds (time.process_time), each from cold memos. The
   invented-specifics scan's cost is the second minus the first.
3. On the first `--sample` conversations: the scan as it was before issue 49 (every pattern over every text, the
   context read again for every reply: the copy kept in tests/unit/data/test_specifics_fast.py) against the fast
   path, per conversation, and that both find the same specifics.

The machine's load average is printed beside each number: on a shared machine CPU seconds are the steadier measure.
Support conversations come from bench/support_data.py (not committed; written under --work).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO / "tests" / "unit" / "data")]

from data_path import measure  # noqa: E402  (bench/data_path.py)
from support_data import write_support_data  # noqa: E402


def _cold(memos) -> None:
    for memo in memos:
        memo.cache_clear()


def scans(data: Path, sample: int) -> dict:
    from test_specifics_fast import old_scan  # the scan as it was (tests/unit/data/test_specifics_fast.py)

    from finetune.data import invented, sensitive, specifics
    from finetune.data.prepare import read_conversations

    memos = (specifics._specifics, specifics.text_keys, sensitive._phone_spans)
    load = os.getloadavg()[0]
    began = time.process_time()
    conversations, _ = read_conversations(str(data))
    read_s = time.process_time() - began
    invented.scan_both(conversations[:200])  # the detectors' libraries loaded before anything is timed
    _cold(memos)
    began = time.process_time()
    sensitive.scan_conversations(conversations)
    sensitive_s = time.process_time() - began
    _cold(memos)
    began = time.process_time()
    _, _, found = invented.scan_both(conversations)
    both_s = time.process_time() - began
    part = conversations[:sample]
    _cold(memos)
    began = time.process_time()
    fast = [invented.scan_conversation(c) for c in part]
    fast_s = time.process_time() - began
    began = time.process_time()
    old = [old_scan(c) for c in part]
    old_s = time.process_time() - began
    return {
        "conversations": len(conversations),
        "read_cpu_s": round(read_s, 1),
        "sensitive_cpu_s": round(sensitive_s, 1),
        "both_scans_cpu_s": round(both_s, 1),
        "invented_cpu_s": round(both_s - sensitive_s, 1),
        "invented_found": len(found),
        "sample": len(part),
        "invented_ms_per_conversation": {
            "before": round(1000 * old_s / len(part), 3),
            "after": round(1000 * fast_s / len(part), 3),
        },  # fmt: skip
        "sample_same_found": fast == old,
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--sample", type=int, default=10_000)
    parser.add_argument("--work", default="/tmp/finetune-scan-share")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"support-{args.conversations}.jsonl"
    if not data.exists():
        write_support_data(data, args.conversations)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    model = work / "toy"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "finetune", "toy-model", str(model)], check=True, env=env, cwd=REPO,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    cache = work / "tokens"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    plan = measure([sys.executable, "-m", "finetune", "plan", str(data), "--model", str(model), "--json",
                    "--cache-dir", str(cache)], env)  # fmt: skip
    plan.pop("stdout")
    result = {"cores": len(os.sched_getaffinity(0)), "plan_cold": plan, "scans": scans(data, args.sample)}
    result["scans_share_of_plan_cpu"] = round(result["scans"]["both_scans_cpu_s"] / plan["cpu_s"], 3)
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
