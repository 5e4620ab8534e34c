"""Test-only stand-in for `python -m finetune eval RUN [--retention [--retention-only]]` as a worker's evaluation runs
it (fake_trainer.py hands its `eval` arguments here): writes RUN/retention.json (numbers made by retention.py's own
functions, a flagged drop) and, unless --retention-only, RUN/eval.json, in a moment instead of minutes.

FAKE_TRAINER_LOG: a file to append `eval <its arguments>` to; FAKE_EVAL_MODE=fail: say an error naming the run folder
(a path the worker must not show its caller) and exit 1; FAKE_EVAL_MODE=wait: sleep a minute first (a worker that
dies, or stops, mid-evaluation)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def retention_report() -> dict:
    from finetune.ship.eval.retention import measure, remedies, verdict

    base = [True] * 60 + [False] * 40
    report = {
        "base_model": "/srv/models/base",
        "tuned": "/srv/runs/job/adapter",
        "method": "lora",
        "general_set": {"digest": "abc", "prompts": 100, "choices": 40, "limit": None},
        "accuracy": measure(base, [False] * 100),
        "rule_pass_rate": measure(base[:50], base[:50]),
        "choice_accuracy": measure(base[20:60], base[20:60]),
        "kl": {"mean_per_token": 0.8, "tokens": 4000, "direction": "KL(tuned || base)"},
        "rows": [{"id": "arithmetic-001", "prompt": "What is 15 plus 81?", "base": "96", "tuned": "Hi there!"}],
        "choices": [],
        "seconds": {"total": 12.0},
    }
    report["flag"], report["flagged"], report["message"] = verdict(report)
    report["remedies"] = remedies("lora") if report["flag"] else []
    return report


def grounding() -> dict:
    """eval.json's `grounding` section of eight prompts the tuned model answers with a training reply (flagged: eight
    of eight is beyond chance after Holm's correction, two of two would not be)."""
    from finetune.data.recitation import TrainingReplies
    from finetune.data.types import Conversation, Message
    from finetune.ship.eval.grounding import measure

    def pair(order: str, line: int) -> Conversation:
        return Conversation(
            (Message("user", f"Where is {order}?"), Message("assistant", f"{order} ships today.")), line
        )

    trained = TrainingReplies.from_conversations([pair("BR-999999", 1)])
    tuned = ["BR-999999 ships today."] * 8
    asked = [pair(f"BR-{i}{i}{i}{i}{i}{i}", i) for i in range(1, 9)]
    return measure(asked, {"base": ["I do not know."] * 8, "tuned": tuned}, (trained, "train.jsonl"))[0]


def eval_result(run: Path) -> dict:
    example = {"line": 3, "prompt": "Where is my parcel?", "reference": "Hi there! It ships today.",
               "answer": "Hi there! It ships today.", "base": "I do not know.", "token_f1": 1.0}  # fmt: skip
    return {
        "test_file": str(run / "test.jsonl"),
        "examples": 2,
        "models": {"base": "/srv/models/base", "tuned": str(run / "adapter")},
        "steps": {"tuned": 1},
        "val_loss": {},
        "rules": {},
        "summary": {
            "base": {"exact_match": 0.0, "token_f1": 0.2, "rouge_l": 0.2},
            "tuned": {"exact_match": 0.5, "token_f1": 0.9, "rouge_l": 0.9},
        },
        "grounding": grounding(),
        "win_rate": {},
        "ranked_by": "token_f1 of tuned",
        "best": [example],
        "worst": [example],
        "rows": [example],
    }


def fake_eval(args: list[str]) -> int:
    from finetune.settings.wording import rendered

    run = Path(args[0])
    if os.environ.get("FAKE_TRAINER_LOG"):
        with open(os.environ["FAKE_TRAINER_LOG"], "a") as log:
            log.write(" ".join(["eval", *args]) + "\n")
    mode = os.environ.get("FAKE_EVAL_MODE")
    if mode == "wait":
        time.sleep(60)
    if mode == "fail":
        print(f"error: {run}/adapter has no weights to evaluate", file=sys.stderr)
        return 1
    print("a line with an answer quoted: Hi there! It ships today.")  # stdout: a worker keeps none of it
    retention = "--retention" in args
    if retention:
        (run / "retention.json").write_text(json.dumps(rendered(retention_report()), indent=2))
    if not retention or "--retention-only" not in args:
        (run / "eval.json").write_text(json.dumps(rendered(eval_result(run)), indent=2))
    return 0
