"""`finetune eval RUN --retention`: did tuning cost the model what it already knew?

    report = check_retention("runs/one")       # the run's base and its final weights, on the general set
    write_retention("runs/one", report)         # RUN/retention.json

The base and the tuned model answer the general set that ships with the package (general_set.py: arithmetic,
unit conversions, facts, instructions with a checkable rule, and multiple-choice questions), never trained on:

accuracy          share of arithmetic, conversion and fact prompts answered right (greedy answers, checked)
rule_pass_rate    share of instructions whose rule the answer keeps ("answer in exactly three words", ...)
choice_accuracy   share of multiple-choice questions whose right option the model finds most likely: each
                  option is scored as the reply to the question (after the reply's first words, `lead`) by
                  its mean log-likelihood per token; a total would favour the option with the fewest tokens
kl                mean over tokens of KL(tuned || base), in nats: on the base's own greedy answers (teacher-
                  forced: the prompt, then the base's answer up to and including its end-of-turn token), at
                  every answer token, sum_v p_tuned(v) (log p_tuned(v) - log p_base(v)) over the vocabulary.
                  0 means the tuned model predicts the base's answers exactly as the base does.

Each rate has a 95% Wilson interval per model, and the change (tuned - base) Newcombe's interval for paired
outcomes (intervals.py). A change whose whole interval is below 0 is a drop beyond chance: it sets `flag`,
and the report names it with the usual remedies. One loaded base serves both sides of a LoRA run (its adapter
switched off, then on); a full run loads the base beside the tuned model.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

from finetune.data.prompting import prompt_ids
from finetune.settings.wording import act, ref, rendered
from finetune.ship.eval.general_set import ANSWER_KINDS, Choice, GeneralPrompt, load_general_set, passed, set_digest
from finetune.ship.eval.intervals import paired_difference, wilson
from finetune.ship.run_folder import load_for_generation, locate_weights, read_json

RETENTION_FILE = "retention.json"
MAX_NEW_TOKENS = 48
BATCH = 64
SCORE_BATCH = 16
MEASURES = {  # key in retention.json: what a reader calls it
    "accuracy": "accuracy",
    "rule_pass_rate": "rule pass-rate",
    "choice_accuracy": "multiple-choice accuracy",
}
REMEDIES = {  # settings named for each reader (wording.py): write_retention and the command line render them
    "epochs": f"Train fewer epochs ({ref('epochs')}), or keep an earlier checkpoint ({act('compare_checkpoints')}).",
    "lr": f"Lower the learning rate ({ref('lr')}).",
    "lora": "Tune a LoRA adapter instead of every weight ({}): the base weights stay as they were.",
    "smaller_lora": f"The run is a LoRA adapter already: a lower rank ({ref('lora_rank')}) changes less of the base.",
    "smaller_lora_head": f"The run is a LoRA adapter already: a lower rank ({ref('lora_rank')}) or the output layer "
    f"left as the base had it ({ref('lora_train_head', 'off')}) changes less of the base.",
    "mix": "Mix general conversations into the training file (a share of everyday questions with plain answers, like "
    "examples/generate_general.py writes), so tuning keeps rehearsing what the base knew.",
}


def remedies(method: str, head_trained: bool = False, objective: str = "sft") -> list[str]:
    """The usual remedies for forgetting, in the order to try them; LoRA instead of full only for a full run (the
    base method of a preference run), the output layer only when the LoRA run trained it."""
    smaller = "smaller_lora_head" if head_trained else "smaller_lora"
    lora = REMEDIES["lora"].format(ref("base_method" if objective == "dpo" else "method", "lora"))
    chosen = ("epochs", "lr", smaller if method == "lora" else "lora", "mix")
    return [lora if key == "lora" else REMEDIES[key] for key in chosen]


KL_DEFINITION = (
    "mean over answer tokens of KL(tuned || base) = sum_v p_tuned(v) * (log p_tuned(v) - log p_base(v)), in nats, "
    "on the base's own greedy answers (teacher-forced, answer and end-of-turn tokens only)"
)


def _subset(items: tuple, limit: int | None) -> list:
    """`limit` items spread evenly over the set (every kind keeps its share); all of them without a limit."""
    if limit is None or limit >= len(items):
        return list(items)
    return [items[i * len(items) // limit] for i in range(limit)]


@contextmanager
def _adapter_off(model):
    with model.disable_adapter():
        yield model


def _load(run: Path):
    """(the run's weights, {"base": ..., "tuned": ...} each a context manager giving that model, tokenizer)."""
    from finetune.train.model import load_model  # torch: the dashboard and the model card read this module

    weights = locate_weights(run)
    tuned, tokenizer = load_for_generation(weights)
    if weights.is_lora:  # one copy of the base weights: the adapter (and a trained output layer) switched off
        base = partial(_adapter_off, tuned)
    else:
        base_model = load_model(weights.base)
        base_model.eval()
        base = partial(nullcontext, base_model)
    return weights, {"base": base, "tuned": partial(nullcontext, tuned)}, tokenizer


def _choice_rows(tokenizer, choices: list[Choice]) -> list[tuple[list[int], list[int]]]:
    """(context, option tokens) for every option of every question: the question in the chat template, the
    reply's lead, then the option."""
    rows = []
    for choice in choices:
        prompt = tokenizer.apply_chat_template(choice.messages(), tokenize=False, add_generation_prompt=True)
        head = tokenizer(prompt + choice.lead, add_special_tokens=False)["input_ids"]
        for option in choice.options:
            full = tokenizer(f"{prompt}{choice.lead} {option}", add_special_tokens=False)["input_ids"]
            shared = next((i for i, (a, b) in enumerate(zip(head, full, strict=False)) if a != b), len(head))
            shared = min(shared, len(full) - 1)  # a merge across the boundary: score from where they differ
            rows.append((full[:shared], full[shared:]))
    return rows


def measure(base_ok: list[bool], tuned_ok: list[bool]) -> dict:
    """One rate of both models on the same items: each with its Wilson interval, the paired change, a drop or not."""
    n = len(base_ok)

    def side(ok: list[bool]) -> dict:
        low, high = wilson(sum(ok), n)
        return {"rate": sum(ok) / n if n else 0.0, "correct": sum(ok), "low": low, "high": high}

    change = paired_difference(base_ok, tuned_ok)
    return {"n": n, "base": side(base_ok), "tuned": side(tuned_ok), "change": change, "dropped": change["high"] < 0}


def points(change: float) -> str:
    """A change of a rate in whole percentage points, signed: '+3', '-31', '+0'."""
    return f"{round(100 * change):+d}"


def describe(key: str, numbers: dict) -> str:
    """'accuracy 62% -> 31% (change -31 points, 95% interval -38 to -24)'."""
    change = numbers["change"]
    return (
        f"{MEASURES[key]} {numbers['base']['rate']:.0%} -> {numbers['tuned']['rate']:.0%} "
        f"(change {points(change['value'])} points, 95% interval {points(change['low'])} to {points(change['high'])})"
    )


def verdict(report: dict) -> tuple[bool, list[str], str]:
    """(flag, the measures that dropped beyond their interval, the verdict in plain words)."""
    measured = [m for m in MEASURES if report[m]["n"]]
    flagged = [m for m in measured if report[m]["dropped"]]
    if flagged:
        drops = "; ".join(describe(m, report[m]) for m in flagged)
        message = (
            f"Tuning cost the model some of what it knew: {drops}. The whole interval is below zero, so the drop "
            "is more than chance."
        )
    else:
        message = (
            "No drop beyond chance on the general set: " + "; ".join(describe(m, report[m]) for m in measured) + "."
        )
    return bool(flagged), flagged, message


def check_retention(
    run: str | Path, *, max_new_tokens: int | None = None, batch_size: int = BATCH, limit: int | None = None
) -> dict:
    """Compare a run's final weights with its base on the general set; returns retention.json's content.

    `max_new_tokens` bounds each greedy answer (default MAX_NEW_TOKENS, 48); `batch_size` prompts are answered
    together (BATCH, 64: on SmolLM2-135M, one CPU thread, 17% less CPU time than 32); teacher-forced scoring runs
    SCORE_BATCH rows at a time (its logits span the whole vocabulary). `limit` asks only that many prompts and
    that many multiple-choice questions (spread over the set): quicker, with wider intervals."""
    started = time.perf_counter()
    max_new_tokens = max_new_tokens or MAX_NEW_TOKENS
    all_prompts, all_choices = load_general_set()
    prompts: list[GeneralPrompt] = _subset(all_prompts, limit)
    choices: list[Choice] = _subset(all_choices, limit)
    weights, sides, tokenizer = _load(Path(run))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    loaded = time.perf_counter()
    new_ids, answers = _answer(sides, tokenizer, prompts, max_new_tokens, batch_size)
    ok = {name: [passed(p, a) for p, a in zip(prompts, got, strict=True)] for name, got in answers.items()}
    generated = time.perf_counter()
    kl_rows = _kl_on_base_answers(sides, tokenizer, prompts, new_ids["base"], pad_id)
    picks = _pick_options(sides, tokenizer, choices, pad_id)
    scored = time.perf_counter()

    report = _numbers(weights, prompts, choices, ok, picks, kl_rows, limit)
    report["settings"] = {
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "choice_score": "mean log-likelihood per option token, after the question and the reply's lead",
        "interval": "95%: Wilson per model; Newcombe's paired score interval (method 10) for the change",
    }
    report["flag"], report["flagged"], report["message"] = verdict(report)
    plan = read_json(weights.run / "plan.json")
    head_trained, objective = bool(plan.get("lora_train_head")), plan.get("objective", "sft")
    report["remedies"] = remedies(report["method"], head_trained, objective) if report["flag"] else []
    report["rows"] = _prompt_rows(prompts, answers, ok, kl_rows)
    report["choices"] = _picked_choices(choices, picks)
    report["seconds"] = {
        "load": round(loaded - started, 2),
        "generate": round(generated - loaded, 2),
        "score": round(scored - generated, 2),
        "total": round(scored - started, 2),
    }
    return report


def _answer(sides: dict, tokenizer, prompts: list[GeneralPrompt], max_new_tokens: int, batch_size: int):
    """The greedy answers of both sides: ({side: new token ids per prompt}, {side: decoded answer per prompt})."""
    from finetune.ship.eval.generate import generate_ids  # torch: the dashboard and the card read this module

    messages = [p.messages() for p in prompts]
    new_ids = {}
    for name, side in sides.items():
        with side() as model:
            new_ids[name] = generate_ids(model, tokenizer, messages, max_new_tokens, batch_size)
    answers = {
        name: [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in rows]
        for name, rows in new_ids.items()
    }
    return new_ids, answers


def _kl_on_base_answers(sides: dict, tokenizer, prompts: list[GeneralPrompt], base_ids: list, pad_id: int) -> list:
    """KL(tuned || base) on the base's own answers: (sum, tokens) per prompt."""
    from finetune.ship.eval.likelihood import kl_per_row  # torch: the dashboard and the card read this module

    rows = [(prompt_ids(tokenizer, p.messages()), ids) for p, ids in zip(prompts, base_ids, strict=True)]
    return kl_per_row(sides["tuned"], sides["base"], rows, pad_id, batch_size=SCORE_BATCH)


def _pick_options(sides: dict, tokenizer, choices: list[Choice], pad_id: int) -> dict[str, list[int]]:
    """Multiple choice: each side's most likely option per question (mean log-likelihood per option token)."""
    from finetune.ship.eval.likelihood import target_log_probs  # torch: the dashboard and the card read this module

    option_rows = _choice_rows(tokenizer, choices)
    picks: dict[str, list[int]] = {}
    for name, side in sides.items():
        with side() as model:
            scores = target_log_probs(model, option_rows, pad_id, batch_size=SCORE_BATCH)
        means, at = [sum(s) / len(s) for s in scores], 0
        picks[name] = []
        for choice in choices:
            options = means[at : at + len(choice.options)]
            picks[name].append(max(range(len(options)), key=options.__getitem__))
            at += len(choice.options)
    return picks


def _numbers(weights, prompts: list[GeneralPrompt], choices: list[Choice], ok: dict, picks: dict, kl_rows: list,
             limit: int | None) -> dict:  # fmt: skip
    """The report's measures: what was compared, each rate of both models with its intervals, per kind, and KL."""
    right = {name: [pick == c.answer for pick, c in zip(got, choices, strict=True)] for name, got in picks.items()}
    answer_items = [i for i, p in enumerate(prompts) if p.kind in ANSWER_KINDS]
    rule_items = [i for i, p in enumerate(prompts) if p.kind == "rule"]
    kl_sum, kl_tokens = sum(s for s, _ in kl_rows), sum(n for _, n in kl_rows)
    return {
        "base_model": weights.base,
        "tuned": str(weights.adapter or weights.model),
        "method": "lora" if weights.is_lora else "full",
        "general_set": {"digest": set_digest(), "prompts": len(prompts), "choices": len(choices), "limit": limit},
        "n": {"answers": len(answer_items), "rules": len(rule_items), "choices": len(choices)},
        "accuracy": measure([ok["base"][i] for i in answer_items], [ok["tuned"][i] for i in answer_items]),
        "rule_pass_rate": measure([ok["base"][i] for i in rule_items], [ok["tuned"][i] for i in rule_items]),
        "choice_accuracy": measure(right["base"], right["tuned"]),
        "by_kind": {
            kind: {
                "n": len(items),
                "base": sum(ok["base"][i] for i in items) / len(items),
                "tuned": sum(ok["tuned"][i] for i in items) / len(items),
            }
            for kind in dict.fromkeys(p.kind for p in prompts)
            if (items := [i for i, p in enumerate(prompts) if p.kind == kind])
        },
        "kl": {
            "mean_per_token": kl_sum / kl_tokens if kl_tokens else 0.0,
            "tokens": kl_tokens,
            "direction": "KL(tuned || base)",
            "definition": KL_DEFINITION,
        },
    }


def _prompt_rows(prompts: list[GeneralPrompt], answers: dict, ok: dict, kl_rows: list) -> list[dict]:
    return [
        {
            "id": p.id,
            "kind": p.kind,
            **({"rule": p.rule} if p.rule else {}),
            "prompt": p.prompt,
            "base": answers["base"][i],
            "tuned": answers["tuned"][i],
            "base_passed": ok["base"][i],
            "tuned_passed": ok["tuned"][i],
            "kl": kl_rows[i][0] / kl_rows[i][1] if kl_rows[i][1] else 0.0,
        }
        for i, p in enumerate(prompts)
    ]


def _picked_choices(choices: list[Choice], picks: dict) -> list[dict]:
    return [
        {
            "id": c.id,
            "question": c.question,
            "answer": c.options[c.answer],
            "base": c.options[picks["base"][i]],
            "tuned": c.options[picks["tuned"][i]],
        }
        for i, c in enumerate(choices)
    ]


def summary(report: dict) -> dict:
    """The report without its per-prompt rows and server paths: for eval.json, the model card and the dashboard."""
    return {k: v for k, v in report.items() if k not in ("rows", "choices", "tuned", "base_model")}


def write_retention(run: str | Path, report: dict) -> Path:
    """RUN/retention.json, written whole or not at all, its remedies in its reader's terms (wording.py)."""
    path = Path(run) / RETENTION_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rendered(report), ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    return path
