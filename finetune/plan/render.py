"""The human form of a plan: what is trained on, a short table of settings, why Auto chose each value,
memory, cost and the advice. No torch."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from finetune.data.formats import FORMAT_NAMES
from finetune.plan.plan import Plan, derived_labels
from finetune.rules.memory import gib
from finetune.settings.registry import plan_labels
from finetune.settings.wording import for_cli

# the plan keys the table shows, in its order (their labels are declared with each setting, or on Plan)
SHOWN = (
    "epochs", "batch_size", "grad_accum", "devices", "effective_batch", "steps_per_epoch", "total_steps",
    "warmup_steps", "learning_rate", "lora_rank", "lora_alpha", "lora_train_head", "eval_every", "save_every",
    "gradient_checkpointing", "shard", "adapter_scale", "device", "dtype",
)  # fmt: skip
HIDDEN_WHEN = {"adapter_scale": (None, "off")}  # a row left out at these values (off: the run as it always was)
DERIVED = {
    "effective_batch": "batch x accumulation x devices",
    "steps_per_epoch": "",  # filled in below
    "total_steps": "steps per epoch x epochs",
    "device": "every model of the run, in its precision",
}


def _n(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def _value(plan: Plan, field: str) -> str:
    value = getattr(plan, field)
    if isinstance(value, bool):
        return "on" if value else "off"
    if field == "learning_rate":
        return f"{value:g}"
    if field == "warmup_steps":
        return f"{value} ({plan.warmup_ratio:.0%})"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:,}" if isinstance(value, int) else str(value)


def _source(plan: Plan, field: str) -> str:
    if field in plan.auto:
        return "auto"
    if field == "steps_per_epoch":
        return f"records / effective batch ({'rounded up' if plan.last_batch == 'keep' else 'rounded down'})"
    if field == "total_steps" and plan.total_steps < plan.planned_steps:
        return f"cut from {plan.planned_steps:,} by {for_cli('max_steps')}"
    if field in ("grad_accum", "devices") and getattr(plan, field) == 1:
        return "default"
    return DERIVED.get(field, "you")


def _data_lines(plan: Plan) -> list[str]:
    unknown = "unknown (what-if)" if plan.data.what_if else "unknown"
    conversations = unknown if plan.data.conversations is None else f"{plan.data.conversations:,}"
    messages = unknown if plan.data.messages is None else f"{plan.data.messages:,}"
    val = "unknown" if plan.data.validation_examples is None else f"{plan.data.validation_examples:,}"
    records, groups = ("pairs", "prompts") if plan.objective == "dpo" else ("records", "conversations")
    if plan.data.validation_conversations is not None:
        val += f" {records} from {plan.data.validation_conversations:,} {groups}"
    lines = [
        f"Training   {plan.data.examples:,} {records} (examples) from {conversations} {groups}, {messages} messages"
        + (
            f"; format {FORMAT_NAMES.get(plan.data.data_format, plan.data.data_format)}"
            if plan.data.data_format
            else ""
        ),
        f"Validation {val}"
        + (f" ({plan.data.val_fraction:.0%} held out)" if plan.data.val_fraction else "")
        + (
            f"; {plan.data.duplicates_removed} {'pairs whose prompt is trained on' if plan.objective == 'dpo' else 'copies of training conversations'} removed"
            if plan.data.duplicates_removed
            else ""
        ),
    ]
    if plan.data.tokens_in_file is None:
        lines.append("Tokens     unknown (give --tokens)")
    else:
        approx = "~" if not plan.tokens_exact else ""
        replayed = (plan.replay_added or {}).get("tokens") or 0
        general = f" + {approx}{replayed:,} in your general conversations" if plan.replay_billed else ""
        lines.append(
            f"Tokens     {approx}{plan.data.tokens_in_file - replayed:,} in {'your' if replayed else 'the'} file{general} "
            f"x {plan.epochs} epochs = {approx}{_n(plan.tokens_processed)} processed (billed); each record seen "
            f"{plan.times_each_example_seen}x"
        )
        if plan.data.target_tokens is not None and plan.data.context_tokens is not None:
            lines.append(
                f"           {approx}{plan.data.target_tokens:,} scored + {approx}{plan.data.context_tokens:,} context "
                "(prompts, tool schemas and results: read and billed, never scored)"
            )
    if plan.replay_added:  # self-replay (docs/retention.md)
        added = plan.replay_added
        lines.append(
            f"Replay     {added['rows']:,} general rows ({added['distinct_rows']:,} distinct) from "
            f"{'the ' if added['source'] == 'base model' else ''}{added['source']}, {added['ratio']:g} per team row, "
            f"mixed among your {added['team_rows']:,} (the records and steps above count them): "
            f"{_n(added['tokens'])} tokens per epoch, {_n(added.get('tokens_processed'))} trained in all, in the time "
            f"estimate; {_whose(plan.replay_billed)}{_answered(added.get('generated'), added.get('pending'))}"
        )
        if plan.replay_targets == "soft":
            lines.append(
                "           soft targets: each replay answer token is trained toward the base model's whole next-token "
                "distribution (KL to the base, one more forward pass of the base over the row: in the time estimate)"
            )
    if plan.general_val_set:  # the forgetting curve (docs/retention.md)
        lines.append(_general_val_line(plan.general_val_set))
    return lines


def _whose(billed: bool) -> str:
    return "your own conversations: billed like your file" if billed else "the product's own work, not billed"


def _answered(generated: dict | None, pending: dict | None = None) -> str:
    """What the base's answers for replay cost this run: '; the base answered 40 prompts for them now (2m 10s, once
    per base: cached)' or '; the base's answers read from the cache'; for a plan that generates nothing, what
    training will answer."""
    if pending:
        return _pending(pending) + ("; tokens count answers not given yet at the cap" if pending["prompts"] else "")
    if not generated:
        return ""
    if not generated["answered_now"]:
        return f"; the base's answers to {generated['prompts']} prompts read from the cache"
    cached = f", {generated['from_cache']} read from the cache" if generated["from_cache"] else ""
    return (
        f"; the base answered {generated['answered_now']} prompts for them now ({_duration(generated['seconds'])}, "
        f"once per base: cached{cached}; {generated['finished']} finished)"
    )


def _pending(pending: dict) -> str:
    """'; the base answers 40 prompts when training starts (about 2 min, once per base: cached)'."""
    if not pending["prompts"]:
        return "; the base's answers read from the cache"
    return f"; the base answers {_when_training(pending)}"


def _when_training(pending: dict) -> str:
    time = f"about {_duration(pending['estimated_s'])}, " if pending.get("estimated_s") is not None else ""
    return f"{pending['prompts']} prompts when training starts ({time}once per base: cached)"


def _general_val_line(general: dict) -> str:
    """What the forgetting curve measures and what it costs (its evaluations are not billed)."""
    if general.get("pending"):  # a plan that generates nothing: counted, answers not given yet at the cap
        answers = f"given to {_when_training(general['pending'])}"
    else:
        answers = (
            "read from the cache"
            if general["cached"]
            else f"generated once for this base in {_duration(general['generation_s'])} (cached)"
        )
    time = f", about {_duration(general['seconds'])} in all" if general.get("seconds") is not None else ""
    notes = [f"{general['answers']} finished" if general["answers"] is not None else "counted at the cap"]
    notes += [f"{general['left_out']} left out as longer than the record limit"] if general.get("left_out") else []
    notes += [f"{general['shortened']} shortened to it"] if general.get("shortened") else []
    return (
        f"Forgetting the base model's answers to {general['prompts']} held-out general prompts, never trained on "
        f"({', '.join(notes)}): {general['records']:,} records, "
        f"{_n(general['tokens'])} tokens read at each of {general['evaluations']} evaluations (the first before "
        f"step 1){time}, not billed; the base's answers {answers}"
    )


def _memory_line(plan: Plan) -> str:
    m = plan.memory
    if not m.known:
        return "Memory     unknown (model size unknown)"
    fit = {True: "fits", False: "does NOT fit", None: "no limit known for"}[m.fits_device]
    where = f"{m.device} (assumed, no {for_cli('gpu')})" if m.device_assumed else m.device
    on = m.gradient_checkpointing
    other = m.activations_without_checkpointing if on else m.activations_with_checkpointing
    return (
        f"Memory     {gib(m.total)} per device ({fit} {where}): weights {gib(m.weights)}, gradients "
        f"{gib(m.gradients)}, AdamW {gib(m.optimizer)}, activations {gib(m.activations)} "
        f"({'with' if on else 'without'} checkpointing; {gib(other)} {'without' if on else 'with'}). "
        f"{m.parameters:,} parameters, {m.trainable_parameters:,} trainable. "
        f"Fits: {', '.join(m.fits) or 'none of the named sizes'}"
    )


def _cost_line(plan: Plan) -> str | None:
    c = plan.cost
    parts = []
    if c.token_cost is not None:
        parts.append(f"{c.token_cost:,.2f} for {c.billed_tokens:,} tokens at {c.price_per_million_tokens:g} per 1M")
    if c.seconds is not None:
        device = f"{c.devices} x {c.device}{' (assumed)' if c.device_assumed else ''}"
        estimate = f"about {_duration(c.seconds)} on {device}"
        if c.time_cost is not None:
            estimate += f" = {c.device_hours:.2f} device-hours x {c.gpu_hour_price:g} = {c.time_cost:,.2f}"
        parts.append(estimate + " (estimate)")
    return "Cost       " + "; ".join(parts) if parts else None


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render_plan(plan: Plan, console: Console | None = None) -> None:
    """Print the plan: data, settings (value and who set it), Auto's reasons, memory, cost, warnings."""
    console = console or Console(highlight=False)
    out = lambda text="", **kw: console.print(text, markup=False, **kw)  # noqa: E731  (user text may hold [brackets])
    method = f"{plan.method} fine-tuning" if plan.method == "full" else "LoRA"
    if plan.objective == "dpo":
        method = f"preference tuning (DPO, beta {plan.beta:g}) with {method}"
    model = plan.model or f"(no {for_cli('model')})"
    out(f"finetune plan{' (what-if)' if plan.data.what_if else ''}: {method} of {model}", style="bold")
    for line in _data_lines(plan):
        out(line)

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("setting", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("set by")
    labels = plan_labels() | derived_labels()
    for field in SHOWN:
        if getattr(plan, field) in HIDDEN_WHEN.get(field, (None,)) or (field == "shard" and plan.devices == 1):
            continue
        table.add_row(labels[field], _value(plan, field), _source(plan, field))
    console.print(table)

    if plan.auto:
        out("Why (Auto):", style="bold")
        for field, reason in plan.auto.items():
            if field != "shard" or plan.devices > 1:
                out(f"  {field}: {reason}")
    out(_memory_line(plan))
    cost = _cost_line(plan)
    if cost:
        out(cost)
    for note in plan.cost.notes:
        out(f"  note: {note}", style="dim")
    if plan.warnings:
        out(f"Warnings ({len(plan.warnings)}):", style="bold")
        for w in plan.warnings:
            out(f"  [{w['code']}] {w['message']}")
