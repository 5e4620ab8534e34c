"""How long an evaluation of a run will take: an estimate made before it starts, from the run's plan (the model's size
and the speed its training reached) and the sizes of the sets it answers. Never a measurement; labelled as such.

    estimate = evaluation_estimate(run_folder, retention=True, test=True)
    estimate["seconds"], estimate["how"]

Two models answer (the base and the tuned one), each:

    retention  generate: 265 prompts in batches of 64, up to 48 new tokens each, and 300 requests for longer answers,
               up to 320 new tokens each; score: the prompts and the base's answers again (the KL), and each
               multiple-choice question once per option (retention.py). The base's side is cached once per base;
               the estimate counts both sides (the first check of a base)
    test       generate: the run's test conversations in batches of 32, up to 128 new tokens each (finetune eval)

    forward tokens  prompt tokens (a token per 4 bytes, plus the chat template's) + every token generated or scored
    seconds         STARTUP_S + 2 models x (2 x parameters x forward tokens / rate + forward calls x CALL_S)
    rate            the FLOP/s per device the run's plan used for its training time: measured on the worker with this
                    model when it had measured it, else the plan's assumed rate (1e11 on a CPU, 35% of a GPU's peak)

Generation runs one token of every sequence per forward call, so a small model's time is mostly calls (CALL_S each)
and a large one's mostly FLOPs. Checked against measurements of the set before its instruction requests:
SmolLM2-135M-Instruct's retention check took 278 s on two quiet CPU cores (docs/retention.md, "Time"), estimated
313 s for that work (tests/service/test_evaluations.py holds it within a factor of 1.5); a toy run's took 17 s on this
project's 2-core machine, estimated 17 s. With the 300 requests the same formula gives about 980 s for SmolLM2's
first check; not yet checked against a quiet measurement (the tuned side alone took 1,349 s on one loaded thread).
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

from finetune.rules.cost import CALL_S, CPU_FLOPS, generation_seconds
from finetune.ship.eval.general_set import load_general_set, load_instructions
from finetune.ship.eval.progress import tell
from finetune.ship.eval.retention import BATCH, MAX_NEW_TOKENS, REQUEST_TOKENS, SCORE_BATCH, subset
from finetune.ship.eval.test_split import TEST_FILE

MODELS = 2  # the base and the tuned model
STARTUP_S = 10.0  # a Python process importing torch and loading both models (a small model; a large one: more)
TEMPLATE_TOKENS = 30  # a chat template's tokens around one user message (roles, markers, a default system prompt)
BYTES_PER_TOKEN = 4
TEST_MAX_NEW_TOKENS = 128  # finetune eval's default --max-new-tokens
TEST_BATCH = 32  # generate_answers' batch


def _tokens(text: str) -> int:
    return len(text.encode("utf-8")) // BYTES_PER_TOKEN + TEMPLATE_TOKENS


@cache
def retention_work(with_requests: bool = True, limit: int | None = None) -> dict:
    """Forward tokens and calls of one model answering and scoring the general set (its size, read once); without
    the instruction requests, the set as it was when the estimate was checked against a measurement (278 s); with
    `limit`, the subset `finetune eval --retention-limit` asks (retention.py `subset`)."""
    prompts, choices = load_general_set()
    requests = load_instructions() if with_requests else []
    prompts, choices, requests = subset(prompts, limit), subset(choices, limit), subset(tuple(requests), limit)
    prompt_tokens = sum(_tokens(p.prompt) for p in prompts)
    answered = prompt_tokens + len(prompts) * MAX_NEW_TOKENS
    requested = sum(_tokens(r.prompt) for r in requests) + len(requests) * REQUEST_TOKENS
    options = sum(len(c.options) for c in choices)
    scored = sum(len(c.options) * (_tokens(c.question + " " + c.lead) + 4) for c in choices)  # an option: ~4 tokens
    calls = math.ceil(len(prompts) / BATCH) * (MAX_NEW_TOKENS + 1) + math.ceil(len(prompts) / SCORE_BATCH)
    calls += math.ceil(options / SCORE_BATCH) + math.ceil(len(requests) / BATCH) * (REQUEST_TOKENS + 1)
    return {"prompts": len(prompts), "requests": len(requests), "questions": len(choices),
            "tokens": 2 * answered + requested + scored, "calls": calls}  # fmt: skip


def test_set_work(run: Path, limit: int | None = None) -> dict | None:
    """Forward tokens and calls of one model answering the run's test set (its first `limit` conversations); None
    when the run has none."""
    try:
        lines = [line for line in (run / TEST_FILE).read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return None
    lines = lines[:limit] if limit is not None else lines
    tokens = sum(_tokens(line) for line in lines) + len(lines) * TEST_MAX_NEW_TOKENS  # a line: its prompt and reply
    calls = math.ceil(len(lines) / TEST_BATCH) * (TEST_MAX_NEW_TOKENS + 1)
    return {"conversations": len(lines), "tokens": tokens, "calls": calls}


def _rate(plan: dict) -> tuple[float, str]:
    """FLOP/s of one device, as the run's plan estimated its training time."""
    cost = plan.get("cost") or {}
    flops, seconds, devices = cost.get("flops"), cost.get("seconds"), cost.get("devices") or 1
    if flops and seconds:
        measured = "measured" if cost.get("tokens_per_s") else "assumed"
        return flops / (seconds * devices), f"the {measured} training speed of its plan on {cost.get('device', '?')}"
    return CPU_FLOPS, "an assumed CPU rate"


def evaluation_estimate(
    run: Path, retention: bool, test: bool, limit: int | None = None, test_limit: int | None = None
) -> dict | None:
    """The estimate of `finetune eval RUN [--retention]` on `run` (the work, the seconds, how they were computed);
    None without a plan that knows the model's size. `limit`: --retention-limit; `test_limit`: --limit (the test
    conversations answered). The service's Evaluate button and the command line both show this one."""
    try:
        plan = json.loads((run / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    params = (plan.get("memory") or {}).get("parameters")
    if not params:
        return None
    parts = {"retention": retention_work(True, limit) if retention else None,
             "test": test_set_work(run, test_limit) if test else None}  # fmt: skip
    tokens = sum(p["tokens"] for p in parts.values() if p)
    calls = sum(p["calls"] for p in parts.values() if p)
    rate, source = _rate(plan)
    seconds = STARTUP_S + MODELS * generation_seconds(params, tokens, calls, rate)
    return {
        "seconds": round(seconds),
        "estimate": True,
        "work": {
            "models": MODELS, "parameters": params, "forward_tokens_per_model": tokens,
            "forward_calls_per_model": calls, "flops_per_second": rate,
        } | {name: part for name, part in parts.items() if part},
        "how": (
            f"an estimate, not a measurement: {STARTUP_S:g} s to start and load, then for each of the {MODELS} models "
            f"2 x {params:,} parameters x {tokens:,} forward tokens at {rate:.3g} FLOP/s ({source}) plus "
            f"{calls:,} forward calls at {CALL_S * 1000:g} ms"
        ),
    }  # fmt: skip


def say_estimate(
    run: Path, retention: bool, test: bool, limit: int | None = None, test_limit: int | None = None
) -> None:
    """Before anything loads (`finetune eval`, and so a service evaluation's first event): what the evaluation answers
    and about how long that takes (progress.py)."""
    found = evaluation_estimate(run, retention, test, limit, test_limit)
    if found is None:
        tell("Evaluation: no time estimate (the run's plan does not know the model's size)", {"estimated_s": None})
        return
    work = found["work"]
    parts = [f"{work['test']['conversations']} test conversations"] if "test" in work else []
    if "retention" in work:
        kept = f" (limited to {limit} of each: wider intervals)" if limit else ""
        parts.append(f"the retention check's {work['retention']['prompts']} general prompts, "
                     f"{work['retention']['requests']} requests and {work['retention']['questions']} questions{kept}")  # fmt: skip
    seconds = found["seconds"]
    shown = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
    tell(f"Evaluation: the base and the tuned model answer {' and '.join(parts)}: about {shown} ({found['how']})",
         {"estimated_s": seconds})  # fmt: skip
