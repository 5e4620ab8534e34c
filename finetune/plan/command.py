"""`finetune plan`: the run's arithmetic, Auto choices, memory and cost, before anything is trained.

    finetune plan DATA.jsonl [--model M] [--method lora|full] [--epochs N|auto] ... [--json]
    finetune plan --examples 800 [--tokens 400000] [...]          # what-if: no file, no torch, well under a second

With a data file the cost is one pass of reading and tokenizing it (prepare_data); the what-if form
imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from finetune.config import RunConfig
from finetune.errors import DataError, UserError
from finetune.plan.model_facts import load_model_facts
from finetune.plan.plan import Plan, build_plan, what_if_summary


def make_plan(config: RunConfig, examples: int | None = None, tokens: int | None = None) -> Plan:
    """The plan for a data file (config.data) or, with `examples`, for a what-if question."""
    if config.data and examples is not None:
        raise UserError("give either a data file or --examples (the what-if form), not both")
    if not config.data and examples is None:
        raise UserError("give a data file (finetune plan DATA.jsonl) or --examples N for a what-if plan")
    if tokens is not None and examples is None:
        raise UserError("--tokens goes with --examples (the what-if form); with a data file tokens are counted")
    model_facts = load_model_facts(config.model)
    if examples is not None:
        return build_plan(config, what_if_summary(config, examples, tokens), model_facts)

    from finetune.data.prepare import prepare_data  # the data path may load a tokenizer

    if config.model:
        from finetune.model_source import resolve_model  # fail at once when a hub id cannot be reached

        config = dataclasses.replace(config, model=resolve_model(config.model))
    tokenizer = None
    if config.model:
        from finetune.data.tokenize import load_tokenizer

        tokenizer = load_tokenizer(config.model, config.trust_remote_code, config.chat_template)  # not the data's
    try:
        if config.method == "dpo":
            from finetune.data.preference import prepare_pairs

            prepared = prepare_pairs(config, tokenizer)
        else:
            from finetune.data.preference import is_preference_file

            if is_preference_file(config.data):
                raise UserError(f"{config.data} holds preference pairs (chosen/rejected): plan it with --method dpo")
            prepared = prepare_data(config, tokenizer)
    except DataError:
        raise
    except UserError as exc:
        raise DataError(str(exc)) from None
    return build_plan(config, prepared.summary, model_facts)


def run_plan(config: RunConfig, examples: int | None = None, tokens: int | None = None, as_json: bool = False) -> int:
    """Print the plan (a table, or JSON with --json); 0 on success. User errors raise UserError."""
    plan = make_plan(config, examples, tokens)
    if as_json:
        json.dump(plan.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from finetune.plan.render import render_plan

        render_plan(plan)
    return 0
