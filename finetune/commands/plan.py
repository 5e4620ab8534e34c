"""`finetune plan`: the run's arithmetic, Auto choices, memory and cost, before anything is trained.

    finetune plan DATA.jsonl [--model M] [--method lora|full] [--epochs N|auto] ... [--json]
    finetune plan --examples 800 [--tokens 400000] [...]          # what-if: no file, no torch, well under a second

With a data file it is the first half of a run (finetune/run.py `plan_run`: the data prepared as training
would, then the plan), so `finetune train` with the same settings executes exactly this plan; the what-if
form imports neither torch nor transformers. Planning loads no model: the speed is what this machine's runs left in
its cache, else the FLOP-based guess (which says so); self-replay's rows and the forgetting curve's set are counted,
and the base answers their prompts when training starts (ship/eval/replay_preview.py).
"""

from __future__ import annotations

import json
import sys

from finetune.models.facts import load_model_facts
from finetune.plan.build import build_plan
from finetune.plan.plan import Plan
from finetune.plan.render import render_plan
from finetune.plan.what_if import what_if_summary
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError


def make_plan(config: RunConfig, examples: int | None = None, tokens: int | None = None) -> Plan:
    """The plan for a data file (config.data) or, with `examples`, for a what-if question."""
    if config.data and examples is not None:
        raise UserError("give either a data file or --examples (the what-if form), not both")
    if not config.data and examples is None:
        raise UserError("give a data file (finetune plan DATA.jsonl) or --examples N for a what-if plan")
    if tokens is not None and examples is None:
        raise UserError("--tokens goes with --examples (the what-if form); with a data file tokens are counted")
    if examples is not None:
        return build_plan(config, what_if_summary(config, examples, tokens), load_model_facts(config.model))
    from finetune.run import plan_run  # torch: run.py imports it; the what-if form runs without it

    # no output folder: nothing is loaded, generated or written (self-replay and the forgetting curve are counted)
    return plan_run(config, measure=False).plan


def run_plan(config: RunConfig, examples: int | None = None, tokens: int | None = None, as_json: bool = False) -> int:
    """Print the plan (a table, or JSON with --json); 0 on success. User errors raise UserError."""
    plan = make_plan(config, examples, tokens)
    if as_json:
        json.dump(plan.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render_plan(plan)
    return 0
