"""The model card (README.md) of an export: what the model is, how it was made, how well it did.

Everything comes from the run folder (plan.json, report.json, eval.json when `finetune eval` ran, retention.json
when `finetune eval RUN --retention` ran); a missing figure is left out, never replaced by a placeholder.
`refresh_run_card(run)` rewrites the card training left in the run's own adapter/ or model/ folder, so it carries
the numbers of an evaluation run later.
"""

from __future__ import annotations

import os
from pathlib import Path

from finetune.models.source import origin
from finetune.plan.plan import derived_labels
from finetune.settings.registry import in_a_sentence, plan_labels, setting, settings
from finetune.ship.eval.grounding import GROUNDING_FILE, REFERENCE, cell, line
from finetune.ship.eval.grounding import MEASURES as GROUNDING
from finetune.ship.eval.retention import LABELS, points
from finetune.ship.eval.retention_verdict import cut_sentence
from finetune.ship.run_folder import RunWeights, locate_weights, read_json

# the plan keys the card shows, in this order (their labels are declared with each setting, or on Plan)
HYPERPARAMETERS = (
    "method", "epochs", "total_steps", "batch_size", "grad_accum", "devices", "effective_batch", "learning_rate",
    "schedule", "warmup_steps", "lora_rank", "lora_alpha", "lora_train_head", "max_seq_len", "val_fraction",
)  # fmt: skip


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _cell(value) -> str:
    return "-" if value is None else _number(value)


def _front_matter(base: str, kind: str, method: str | None, gguf: bool = False) -> list[str]:
    tags = ["finetune", "chat", *([method] if method else []), *(["peft"] if kind == "adapter" else [])]
    tags += ["gguf"] if gguf else []
    library = "peft" if kind == "adapter" else "transformers"
    return (
        ["---", f"base_model: {base}", f"library_name: {library}", "pipeline_tag: text-generation", "tags:"]
        + [f"- {tag}" for tag in tags]
        + ["---", ""]
    )


def _usage(kind: str, base: str) -> list[str]:
    if kind == "adapter":
        code = [
            "from peft import AutoPeftModelForCausalLM",
            "from transformers import AutoTokenizer",
            "",
            'model = AutoPeftModelForCausalLM.from_pretrained("path/to/this/folder")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        ]
        note = f"The adapter sits on the base model `{base}` (its path is recorded in `adapter_config.json`)."
    else:
        code = [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        ]
        note = (
            "A plain transformers folder (safetensors, tokenizer, chat template, generation config whose EOS is "
            "the end-of-turn token): vLLM, TGI and SGLang load it as it is."
        )
    code += [
        'messages = [{"role": "user", "content": "Hello!"}]',
        "inputs = tokenizer.apply_chat_template(",
        '    messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"',
        ")",
        "output = model.generate(**inputs, max_new_tokens=200)",
        'print(tokenizer.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True))',
    ]
    return ["## How to use it", "", note, "", "```python", *code, "```", ""]


def _gguf_usage(gguf_type: str) -> list[str]:
    return [
        "### With llama.cpp, Ollama or LM Studio",
        "",
        f"`model.gguf` in this folder is the same model in one GGUF file (weights {gguf_type}), with its tokenizer "
        "and chat template:",
        "",
        "```bash",
        "llama-cli -m model.gguf -cnv              # llama.cpp: chat in the terminal",
        'printf "FROM ./model.gguf\n" > Modelfile && ollama create my-model -f Modelfile   # Ollama',
        "```",
        "",
    ]


def _data(plan: dict, test_split: dict, report: dict) -> list[str]:
    added = plan.get("replay_added") or {}
    bill = report.get("billing") or plan.get("billing") or {}  # what the run billed, else what the plan bills
    base_rows = None if added.get("billed", True) else added.get("rows")
    rows = [
        ("training conversations", plan.get("conversations")),
        ("training records", plan.get("examples")),
        ("validation conversations", plan.get("validation_conversations")),
        ("validation records", plan.get("validation_examples")),
        ("tokens per epoch (replay rows included)" if added else "tokens per epoch", plan.get("tokens_in_file")),
        ("tokens billed", bill.get("tokens_billed", plan.get("tokens_processed"))),
        ("of them, your general conversations' (mixed in by replay)", bill.get("general_data_tokens")),
        ("replay rows the base model answered (not billed)", base_rows),
        ("tokens trained on them (not billed)", bill.get("not_billed_tokens") if base_rows else None),
        (
            "replay rows trained toward",
            "the base's whole next-token distribution (soft targets)"
            if added and plan.get("replay_targets") == "soft"
            else None,
        ),
        ("test conversations (held out before training)", test_split.get("conversations")),
    ]
    lines = ["## Training data", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {_number(value)} |" for name, value in rows if value is not None]
    if bill.get("message"):
        lines += ["", f"What is billed: {bill['message']} ({bill['rule']})."]
    if plan.get("auto", {}).get("val_fraction"):
        lines += ["", f"Validation split: {plan['auto']['val_fraction']}."]
    return [*lines, ""]


def _team_system_row(system: str | None) -> list[str]:
    """The context the team's voice was trained in: the team's prompts need it, general ones go without."""
    if not system:
        return []
    text = system.replace("|", "/").replace("\n", " ")
    return [f"| the team's system message | {text} (on every team conversation that had none; give it for the "
            "team's voice: `finetune chat` and the serving of this run put it first on a request without one) |"]  # fmt: skip


def _labels() -> dict[str, str]:
    return plan_labels() | derived_labels() | {name: setting(name).label for name in ("method", "val_fraction")}


def _auto_capable(key: str) -> bool:
    return any(spec.auto and key in (spec.name, spec.plan_key) for spec in settings())


def _hyperparameters(plan: dict) -> list[str]:
    auto, labels = plan.get("auto") or {}, _labels()
    lines = ["## Hyperparameters", "", "Resolved values; where Auto chose, its reason.", ""]
    lines += ["| setting | value | why |", "|---|---|---|"]
    for key in HYPERPARAMETERS:
        if plan.get(key) is None:
            continue
        reason = auto.get(key) or ("set for this run (not chosen by Auto)" if _auto_capable(key) else "")
        lines.append(f"| {in_a_sentence(labels[key])} | {_number(plan[key])} | {reason.replace('|', '/')} |")
    return [*lines, ""]


def _results(report: dict, step: int | None) -> list[str]:
    lines = ["## Training results", ""]
    if step is not None:
        lines += [f"These weights are the checkpoint of step {step}.", ""]
    facts = [
        ("steps taken", report.get("steps_taken")),
        ("first training loss", report.get("first_train_loss")),
        ("final training loss", report.get("final_train_loss")),
        ("best validation loss", report.get("best_val_loss")),
        ("best step", report.get("best_step")),
        ("final validation loss", report.get("final_val_loss")),
        ("wall time (s)", report.get("wall_time_s")),
    ]
    lines += ["| | |", "|---|---|"] + [f"| {name} | {_number(value)} |" for name, value in facts if value is not None]
    if step is None and report.get("final_weights"):
        which = "the best checkpoint by validation loss" if report.get("final_is_best") else "the last step"
        lines += ["", f"The run's final weights are {which}."]
    diagnosis = report.get("diagnosis") or {}
    if diagnosis.get("message"):
        lines += ["", f"**Diagnosis ({diagnosis.get('kind', '')}):** {diagnosis['message']}"]
        if diagnosis.get("next_step"):
            lines += ["", f"**Next step:** {diagnosis['next_step']}"]
    if (report.get("forgetting") or {}).get("message"):  # the team's curve beside the general one (general_val)
        lines += ["", f"**Voice gained, general kept:** {report['forgetting']['message']}"]
    return [*lines, ""]


def _adapter_scale(report: dict, plan: dict, step: int | None) -> list[str]:
    """The scale written into the adapter after training (adapter_scale), and what it was chosen from."""
    scale = report.get("adapter_scale") or {}
    if not scale or step is not None:  # a checkpoint keeps the adapter as trained
        return []
    value, alpha = scale["value"], plan.get("lora_alpha")
    lines = ["## Adapter scale", ""]
    if value == 1.0:
        lines += [f"The adapter is kept as trained (scale 1): {scale['reason']}.", ""]
    else:
        written = ""
        if isinstance(alpha, (int, float)):
            written = f" (`lora_alpha` {_number(alpha * value)} in `adapter_config.json`: {_number(alpha)} x {value:g})"
        lines += [
            f"After training the adapter was scaled back toward the base: base + {value:g} x the trained update"
            f"{written}; every export of it (merged, GGUF) carries the same scale. Why: {scale['reason']}.",
            "",
        ]
    measured = scale.get("measured") or []
    if measured:
        lines += ["| scale | validation loss | general probe loss |", "|---|---|---|"]
        lines += [
            f"| {m['alpha']:g}{' (the base)' if m['alpha'] == 0 else ''} | {_cell(m.get('val_loss'))} | "
            f"{_cell(m.get('general_loss'))} |"
            for m in measured
        ]
        lines += ["", f"General probe: {(scale.get('general_probe') or {}).get('source', '')}.", ""]
    return lines


def _evaluation(evaluation: dict) -> list[str]:
    overall = evaluation.get("summary") or {}
    if not overall:
        return []
    metrics = sorted({m for numbers in overall.values() for m in numbers})
    lines = ["## Evaluation", "", f"`finetune eval` on {evaluation.get('examples', '?')} held-out conversations", ""]
    wins = evaluation.get("win_rate") or {}
    extra = ["rule win rate vs base"] if wins else []
    lines += ["| model | " + " | ".join(metrics + extra) + " |", "|---" * (len(metrics) + len(extra) + 1) + "|"]
    for model, numbers in overall.items():
        cells = [_number(numbers.get(m, "")) for m in metrics]
        if wins:
            w = wins.get(model)
            cells.append(f"{w['win_rate']:.0%} ({w['wins']} wins, {w['ties']} ties, {w['losses']} losses)" if w else "")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    if evaluation.get("rules"):
        lines += ["", "Rules: " + ", ".join(f"`{name}` = `{pattern}`" for name, pattern in evaluation["rules"].items())]
    return [*lines, ""]


def _grounding(section: dict | None) -> list[str]:
    """Invented specifics, recited training replies and distinct answers (`finetune eval`, or the demo's)."""
    if not section or not section.get("models"):
        return []
    names = ["team's replies" if name == REFERENCE else name for name in section["models"]]
    lines = [
        "## Answers the team would sign",
        "",
        f"On {section['answers']} held-out prompts (95% intervals): an answer invents a specific when it states an "
        "identifier, amount, date, time, card ending, phone number, e-mail address, URL or tracking code its "
        "conversation never gave; it recites when it is a training reply, equal or nearly so.",
        "",
        "| measure | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for key, label in GROUNDING.items():
        lines.append(f"| {label} | " + " | ".join(cell(key, m[key]) for m in section["models"].values()) + " |")
    lines += ["", f"**{'Flag' if section.get('flag') else 'Verdict'}:** {line(section)}."]
    if section.get("flag") and section.get("remedies"):
        lines += ["", "Usual remedies:", ""] + [f"- {remedy}" for remedy in section["remedies"]]
    return [*lines, ""]


def _percent(side: dict) -> str:
    return f"{side['rate']:.0%} ({side['low']:.0%}-{side['high']:.0%})"


def _retention(retention: dict) -> list[str]:
    """What tuning kept of the base's general ability (finetune eval RUN --retention)."""
    if not retention.get("accuracy"):
        return []
    general = retention.get("general_set") or {}
    lines = [
        "## Retention",
        "",
        f"`finetune eval --retention`: the base and this model on {general.get('prompts', '?')} general prompts "
        f"{general.get('requests', 0)} requests for longer answers with instructions on their form, and "
        f"{general.get('choices', '?')} multiple-choice questions never trained on (95% intervals).",
        "",
        "| measure | prompts | base | tuned | change (points) |",
        "|---|---|---|---|---|",
    ]
    for key, name in LABELS.items():
        numbers = retention.get(key) or {}
        if not numbers.get("n"):
            continue
        change = numbers["change"]
        mark = " **drop**" if numbers.get("dropped") else " **rise**" if numbers.get("rose") else ""
        lines.append(
            f"| {name} | {numbers['n']} | {_percent(numbers['base'])} | {_percent(numbers['tuned'])} | "
            f"{points(change['value'])} ({points(change['low'])} to {points(change['high'])}){mark} |"
        )
    kl = retention.get("kl") or {}
    if kl.get("tokens"):
        lines += ["", f"Mean KL(tuned || base) per token on the base's own answers: {kl['mean_per_token']:.4g} nats."]
    if cut := cut_sentence(retention.get("cut_at_cap")):
        lines += ["", f"{cut[0].upper()}{cut[1:]}."]
    if retention.get("message"):
        lines += ["", f"**{'Flag' if retention.get('flag') else 'Verdict'}:** {retention['message']}"]
    if retention.get("flag") and retention.get("remedies"):
        lines += ["", "Usual remedies:", ""] + [f"- {remedy}" for remedy in retention["remedies"]]
    return [*lines, ""]


def _origin_rows(source: dict | None) -> list[str]:
    """The GGUF file the base was converted from, with its sha256 (and the known base it is)."""
    if not source or not source.get("sha256"):
        return []
    rows = [f"| converted from | {source.get('gguf_file')} (GGUF, sha256 {source['sha256']}) |"]
    if source.get("base"):
        rows.append(f"| known base | {source['base']} ({source.get('package')}, licence {source.get('licence')}) |")
    return rows


def model_card(weights: RunWeights, kind: str, gguf_type: str | None = None) -> str:
    """README.md for an export of `kind` "merged", "full" or "adapter" (with `gguf_type`: and its model.gguf)."""
    plan = read_json(weights.run / "plan.json")
    report = read_json(weights.run / "report.json")
    evaluation = read_json(weights.run / "eval.json")
    test_split = read_json(weights.run / "test_split.json")
    method = plan.get("method") or ("lora" if weights.is_lora else "full")
    how = {
        "merged": "a LoRA adapter merged into the base weights",
        "full": "every weight of the base fine-tuned",
        "adapter": "a LoRA adapter (PEFT format) for the base model",
    }[kind]
    title = Path(weights.run).resolve().name
    lines = _front_matter(weights.base, kind, method, gguf=gguf_type is not None)
    lines += [
        f"# {title}",
        "",
        f"A chat model fine-tuned with `finetune` from **{weights.base}**: {how}. It learned to answer the way the "
        "team's conversations answer.",
        "",
        "| | |",
        "|---|---|",
        f"| base model | {weights.base} |",
        *_origin_rows(plan.get("base_origin") or origin(weights.base)),
        *([f"| chat template | {plan['chat_template']} |"] if plan.get("chat_template") else []),
        *_team_system_row(plan.get("team_system")),
        f"| method | {method} |",
        f"| export | {kind} |",
        "",
    ]
    lines += _usage(kind, weights.base) + (_gguf_usage(gguf_type) if gguf_type else [])
    lines += _data(plan, test_split, report) + _hyperparameters(plan) + _results(report, weights.step)
    lines += _adapter_scale(report, plan, weights.step)
    lines += _evaluation(evaluation)
    lines += _grounding(evaluation.get("grounding") or read_json(weights.run / GROUNDING_FILE))
    lines += _retention(read_json(weights.run / "retention.json"))
    lines += [
        "## Limits",
        "",
        "Loss measures how well the model predicts the team's replies, not whether its answers are right: "
        "read its answers (`finetune eval`, `finetune chat`) before relying on it.",
        "",
    ]
    return "\n".join(lines)


def refresh_run_card(run: str | Path) -> Path | None:
    """Rewrite README.md in the run's final adapter/ or model/ folder (training wrote it before any evaluation)."""
    weights = locate_weights(run)
    final = weights.adapter or weights.model
    if final is None or not final.is_dir():
        return None
    path = final / "README.md"
    tmp = final / f".README.md.{os.getpid()}.tmp"
    tmp.write_text(model_card(weights, "adapter" if weights.is_lora else "full"), encoding="utf-8")
    os.replace(tmp, path)
    return path
