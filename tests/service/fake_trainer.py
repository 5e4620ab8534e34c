"""Test-only stand-in for `python -m finetune train --config C --out OUT [--resume]` (fake_service.py starts it):
writes a one-step run folder in milliseconds, so tests can push many jobs through claim, lease, run and
complete. FAKE_TRAINER_LOG: a file to append the run folder's name to (one line per run);
FAKE_TRAINER_MODE=die: SIGKILL itself at once (a trainer that dies); FAKE_TRAINER_MODE=wait: sleep until stopped
(at most a minute: a trainer a test cancels or pauses); FAKE_TRAINER_MODE=stubborn: ignore SIGTERM and sleep a
minute (a trainer in a long step); FAKE_TRAINER_MODE=fail: exit 1 on the library's error FAKE_TRAINER_ERROR (its
`error:` line). Its first argument `eval`: the stand-in for `finetune eval` (fake_evaluation.py)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

args = sys.argv[1:]
if args[0] == "eval":  # `finetune eval RUN [--retention [--retention-only]]`, as a worker's evaluation runs it
    from fake_evaluation import fake_eval

    sys.exit(fake_eval(args[1:]))
out = Path(args[args.index("--out") + 1])
if os.environ.get("FAKE_TRAINER_MODE") == "die":
    os.kill(os.getpid(), signal.SIGKILL)
if os.environ.get("FAKE_TRAINER_MODE") == "fail":
    print(f"error: {os.environ['FAKE_TRAINER_ERROR']}", file=sys.stderr)
    sys.exit(1)
if os.environ.get("FAKE_TRAINER_MODE") == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)
if os.environ.get("FAKE_TRAINER_MODE") == "wait":
    time.sleep(60)  # SIGTERM (a cancel or a pause) ends it
if os.environ.get("FAKE_TRAINER_LOG"):
    with open(os.environ["FAKE_TRAINER_LOG"], "a") as log:
        log.write(out.name + "\n")
(out / "checkpoints" / "step-000001").mkdir(parents=True, exist_ok=True)
(out / "adapter").mkdir(exist_ok=True)
(out / "plan.json").write_text(json.dumps({"total_steps": 1, "save_every": 1, "tokens_processed": 42}))
(out / "metrics.jsonl").write_text(json.dumps({"step": 1, "train_loss": 1.5}) + "\n")
(out / "report.json").write_text(json.dumps({"tokens_processed": 42, "diagnosis": {}}))
