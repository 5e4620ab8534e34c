"""`finetune eval RUN --retention`: did tuning cost the model what it already knew?

    report = check_retention("runs/one")       # the run's base and its final weights, on the general set
    write_retention("runs/one", report)         # RUN/retention.json

The base and the tuned model answer the general set that ships with the package (general_set.py: arithmetic,
unit conversions, facts, instructions with a checkable rule, requests for longer answers with instructions on their
form, and multiple-choice questions), never trained on:

accuracy          share of arithmetic, conversion and fact prompts answered right (greedy answers, checked)
rule_pass_rate    share of instructions whose rule the answer keeps ("answer in exactly three words", ...)
instruction_following
                  share of requests for a longer answer (100-200 words) whose every instruction on its form the
                  answer keeps (a title, a postscript, placeholders, bullet points, JSON, words to avoid, a letter's
                  frequency, a length, lowercase or capitals, no commas, ...: instructions.py), strict
instructions_kept share of those instructions kept, one by one (by_instruction: per kind)
team_voice        share of all general answers that carry one of the team's own recurring lines (a greeting, a
                  sign-off: team_voice.py): a general request answered in the team's voice, not as asked. A rise
                  beyond chance is flagged like a drop of the others
choice_accuracy   share of multiple-choice questions whose right option the model finds most likely: each
                  option is scored as the reply to the question (after the reply's first words, `lead`) by
                  its mean log-likelihood per token; a total would favour the option with the fewest tokens
kl                mean over tokens of KL(tuned || base), in nats: on the base's own greedy answers (teacher-
                  forced: the prompt, then the base's answer up to and including its end-of-turn token), at
                  every answer token, sum_v p_tuned(v) (log p_tuned(v) - log p_base(v)) over the vocabulary.
                  0 means the tuned model predicts the base's answers exactly as the base does.

Each rate has a 95% Wilson interval per model, and the change (tuned - base) Newcombe's interval for paired
outcomes (intervals.py; instructions_kept: a cluster bootstrap by answer). The verdict (family.py): an exact one-sided
paired test per measure, Holm's correction across the measures of the check; a measure it rejects sets `flag`
(at most 5% of checks of an unchanged model are flagged), and the report names it with the usual remedies.
`cut_at_cap` records per side the share of answers cut at the token cap. One loaded base serves both sides of a LoRA
run (its adapter switched off, then on); a full run loads the base beside the tuned model. The base's answers are the same for
every run of that base: they are computed once and cached (general_answers.py).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

from finetune.data.prompting import prompt_ids, stop_ids
from finetune.placement.stages import recorded_in, stage
from finetune.placement.where import of_run
from finetune.settings.fingerprint import model_identity
from finetune.settings.wording import act, ref, rendered
from finetune.ship.eval.family import FAMILY_ALPHA
from finetune.ship.eval.general_answers import (
    Answers,
    GeneralItems,
    Settings,
    answers_of,
    base_answers_cached,
    cache_key,
    cut_at_cap,
)
from finetune.ship.eval.general_set import (
    ANSWER_KINDS,
    Choice,
    GeneralPrompt,
    InstructionRequest,
    load_general_set,
    load_instructions,
    passed,
    set_digest,
)
from finetune.ship.eval.instructions import follows
from finetune.ship.eval.intervals import paired_difference
from finetune.ship.eval.progress import counting
from finetune.ship.eval.retention_verdict import (  # noqa: F401 (LABELS, MEASURES, points: read from here too)
    LABELS,
    MEASURES,
    clustered_measure,
    measure,
    points,
    verdict,
)
from finetune.ship.eval.team_voice import signature_lines, speaks_as_team, team_replies
from finetune.ship.run_folder import load_for_generation, locate_weights, read_json

RETENTION_FILE = "retention.json"
MAX_NEW_TOKENS = 48
REQUEST_TOKENS = 320  # a longer answer: 100-200 words asked, about 130-270 tokens
BATCH = 128
SCORE_BATCH = 16
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


def subset(items: tuple, limit: int | None) -> list:
    """`limit` items spread evenly over the set (every kind keeps its share): item i x len / limit for i below
    `limit`, the same every time; all of them without a limit."""
    if limit is None or limit >= len(items):
        return list(items)
    return [items[i * len(items) // limit] for i in range(limit)]


@contextmanager
def _adapter_off(model):
    with model.disable_adapter():
        yield model


def _load(run: Path):
    """(the run's weights, {"base": ..., "tuned": ...} each a context manager giving that model, tokenizer): both in
    the run's precision on its device, the base loaded as training loaded it (grown to the run's tokenizer, its own
    code when the run trusted it)."""
    from finetune.placement.load import load_placed  # torch: the dashboard and the model card read this module

    weights, placement = locate_weights(run), of_run(run)
    tuned, tokenizer = load_for_generation(weights, placement)
    if weights.is_lora:  # one copy of the base weights: the adapter (and a trained output layer) switched off
        base = partial(_adapter_off, tuned)
    else:
        base_model = load_placed(weights.base, placement, trust_remote_code=weights.trust_remote_code,
                                 vocab_size=len(tokenizer))  # fmt: skip
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


def limited(general_set: dict) -> str:
    """'Limited to 40 general prompts, 40 requests and 40 questions of the set (spread evenly): wider intervals.'"""
    return (f"Limited to {general_set['prompts']} general prompts, {general_set['requests']} requests and "
            f"{general_set['choices']} questions of the set (spread evenly): wider intervals than the whole set's.")  # fmt: skip


def check_retention(
    run: str | Path, *, max_new_tokens: int | None = None, batch_size: int | None = None, limit: int | None = None
) -> dict:
    """Compare a run's final weights with its base on the general set; returns retention.json's content.

    `max_new_tokens` bounds each short greedy answer (default MAX_NEW_TOKENS, 48; the longer answers to the
    instruction requests get REQUEST_TOKENS); `batch_size` prompts are answered together (BATCH, 128: on
    SmolLM2-135M in bf16, one CPU thread, 128 instruction requests answered with 11% less CPU time than at 64, and
    64 with 21% less than at 32; the decoder's cache, allocated once per batch, grows with it); teacher-forced scoring runs SCORE_BATCH rows at a time
    (its logits span the whole vocabulary). `limit` asks only that many prompts, requests and multiple-choice
    questions (spread over the set): quicker, with wider intervals. The base's side comes from the cache when this
    base answered the same set with the same settings before (general_answers.py)."""
    started = time.perf_counter()
    prompts, choices = load_general_set()
    items = GeneralItems(subset(prompts, limit), subset(load_instructions(), limit), subset(choices, limit))
    settings = Settings(max_new_tokens or MAX_NEW_TOKENS, REQUEST_TOKENS, batch_size or BATCH, SCORE_BATCH)
    weights, sides, tokenizer = _load(Path(run))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    choice_rows = _choice_rows(tokenizer, items.choices)
    loaded = time.perf_counter()
    # a line per batch answered (progress.py); RUN/stages.jsonl: where each side ran
    with counting("Retention check"), recorded_in(weights.run):
        answers, base_cached = _both_sides(weights, sides, tokenizer, items, settings, choice_rows, pad_id)
    generated = time.perf_counter()
    kl_rows = _kl_on_base_answers(sides, tokenizer, items.prompts, answers["base"].prompt_ids, pad_id)
    scored = time.perf_counter()

    texts = {name: _decoded(tokenizer, side) for name, side in answers.items()}
    report = _numbers(weights, items, texts, answers, kl_rows, limit, team_replies(weights.run))
    report["settings"] = {
        "max_new_tokens": settings.max_new_tokens,
        "request_tokens": settings.request_tokens,
        "batch_size": settings.batch_size,
        "choice_score": "mean log-likelihood per option token, after the question and the reply's lead",
        "interval": "95%: Wilson per model; Newcombe's paired score interval (method 10) for the change; "
        "instructions_kept: a cluster bootstrap by answer (seeded)",
        "verdict": f"an exact one-sided paired test per measure, Holm's correction across them: family-wise "
        f"{FAMILY_ALPHA:.0%}",
    }
    report["cut_at_cap"] = cut_at_cap(answers, settings, stop_ids(tokenizer))
    report["flag"], report["flagged"], report["message"] = verdict(report)
    if limit is not None:  # a subset: say so wherever the verdict is read
        report["message"] += f" {limited(report['general_set'])}"
    plan = read_json(weights.run / "plan.json")
    head_trained, objective = bool(plan.get("lora_train_head")), plan.get("objective", "sft")
    report["remedies"] = remedies(report["method"], head_trained, objective) if report["flag"] else []
    report["rows"] = _prompt_rows(items.prompts, texts, kl_rows)
    report["requests"] = _request_rows(items.requests, texts)
    report["choices"] = _picked_choices(items.choices, {name: a.picks for name, a in answers.items()})
    report["seconds"] = {
        "load": round(loaded - started, 2),
        "generate": round(generated - loaded, 2),
        "score": round(scored - generated, 2),
        "total": round(scored - started, 2),
        "base_cached": base_cached,  # the base's answers were read from the cache (computed once per base)
    }
    return report


def _both_sides(weights, sides: dict, tokenizer, items: GeneralItems, settings: Settings, choice_rows, pad_id: int):
    """({"base": Answers, "tuned": Answers}, whether the base's came from the cache)."""

    def answer(name: str) -> Answers:
        with sides[name]() as model, stage(f"retention: {name}") as seen:
            seen.model(model)
            return answers_of(model, tokenizer, items, settings, choice_rows, pad_id)

    identity = {**model_identity(weights.base), "placement": of_run(weights.run).cache_key()}
    key = cache_key(identity, tokenizer, set_digest(), items, settings)
    base, cached = base_answers_cached(key, lambda: answer("base"))
    return {"base": base, "tuned": answer("tuned")}, cached


def _decoded(tokenizer, answers: Answers) -> dict[str, list[str]]:
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True).strip()  # noqa: E731
    return {"prompts": [decode(ids) for ids in answers.prompt_ids],
            "requests": [decode(ids) for ids in answers.request_ids]}  # fmt: skip


def _kl_on_base_answers(sides: dict, tokenizer, prompts: list[GeneralPrompt], base_ids: list, pad_id: int) -> list:
    """KL(tuned || base) on the base's own answers: (sum, tokens) per prompt."""
    from finetune.ship.eval.likelihood import kl_per_row  # torch: the dashboard and the card read this module

    rows = [(prompt_ids(tokenizer, p.messages()), ids) for p, ids in zip(prompts, base_ids, strict=True)]
    return kl_per_row(sides["tuned"], sides["base"], rows, pad_id, batch_size=SCORE_BATCH)


def _numbers(weights, items: GeneralItems, texts: dict, answers: dict, kl_rows: list, limit: int | None,
             team: list[str]) -> dict:  # fmt: skip
    """The report's measures: what was compared, each rate of both models with its intervals, per kind, and KL."""
    prompts, choices, requests = items.prompts, items.choices, items.requests
    ok = {name: [passed(p, a) for p, a in zip(prompts, t["prompts"], strict=True)] for name, t in texts.items()}
    kept = {name: [[follows(i, a) for i in r.instructions] for r, a in zip(requests, t["requests"], strict=True)]
            for name, t in texts.items()}  # fmt: skip
    right = {name: [a.picks[i] == c.answer for i, c in enumerate(choices)] for name, a in answers.items()}
    answer_items = [i for i, p in enumerate(prompts) if p.kind in ANSWER_KINDS]
    rule_items = [i for i, p in enumerate(prompts) if p.kind == "rule"]
    kl_sum, kl_tokens = sum(s for s, _ in kl_rows), sum(n for _, n in kl_rows)
    side = lambda name, items: [ok[name][i] for i in items]  # noqa: E731
    return {
        "base_model": weights.base,
        "tuned": str(weights.adapter or weights.model),
        "method": "lora" if weights.is_lora else "full",
        "general_set": {
            "digest": set_digest(),
            "prompts": len(prompts),
            "choices": len(choices),
            "requests": len(requests),
            "limit": limit,
        },  # fmt: skip
        "n": {
            "answers": len(answer_items),
            "rules": len(rule_items),
            "choices": len(choices),
            "requests": len(requests),
            "instructions": sum(len(r.instructions) for r in requests),
        },  # fmt: skip
        "accuracy": measure(side("base", answer_items), side("tuned", answer_items)),
        "rule_pass_rate": measure(side("base", rule_items), side("tuned", rule_items)),
        "choice_accuracy": measure(right["base"], right["tuned"]),
        "instruction_following": measure([all(k) for k in kept["base"]], [all(k) for k in kept["tuned"]]),
        "instructions_kept": clustered_measure(kept["base"], kept["tuned"]),
        "team_voice": _team_voice(texts, team),
        "by_kind": _by_kind(prompts, ok),
        "by_instruction": _by_instruction(requests, kept),
        "kl": {
            "mean_per_token": kl_sum / kl_tokens if kl_tokens else 0.0,
            "tokens": kl_tokens,
            "direction": "KL(tuned || base)",
            "definition": KL_DEFINITION,
        },
    }


def _team_voice(texts: dict, team: list[str]) -> dict:
    """The share of every general answer (short and long) that carries one of the team's recurring lines."""
    lines = signature_lines(team)
    if not lines:
        return {"n": 0, "lines": 0, "why": "no line recurs in the team's replies (or the training file is gone)"}
    voiced = {name: [speaks_as_team(a, lines) for a in t["prompts"] + t["requests"]] for name, t in texts.items()}
    numbers = measure(voiced["base"], voiced["tuned"], "rise")
    numbers.pop("dropped")  # a rise is what flags here (`rose`, decided by verdict)
    return {**numbers, "rose": False, "lines": len(lines)}  # a count, not the lines: a sign-off holds a phone number


def _by_kind(prompts: list[GeneralPrompt], ok: dict) -> dict:
    kinds = {}
    for kind in dict.fromkeys(p.kind for p in prompts):
        items = [i for i, p in enumerate(prompts) if p.kind == kind]
        kinds[kind] = {"n": len(items), "base": sum(ok["base"][i] for i in items) / len(items),
                       "tuned": sum(ok["tuned"][i] for i in items) / len(items)}  # fmt: skip
    return kinds


def _by_instruction(requests: list[InstructionRequest], kept: dict) -> dict:
    """Per instruction kind: how many were asked, the share each model kept, and the change with its paired 95%
    interval (each kind is asked at most once per request, so its outcomes are independent pairs). Not part of the
    flag: with 17 kinds, some interval misses by chance in about one check in three."""
    outcomes: dict[str, tuple[list[bool], list[bool]]] = {}
    for r, row in enumerate(requests):
        for j, instruction in enumerate(row.instructions):
            base, tuned = outcomes.setdefault(instruction.kind, ([], []))
            base.append(kept["base"][r][j])
            tuned.append(kept["tuned"][r][j])
    return {kind: {"n": len(b), "base": sum(b) / len(b), "tuned": sum(t) / len(t), "change": paired_difference(b, t)}
            for kind, (b, t) in outcomes.items()}  # fmt: skip


def _prompt_rows(prompts: list[GeneralPrompt], texts: dict, kl_rows: list) -> list[dict]:
    return [
        {
            "id": p.id,
            "kind": p.kind,
            **({"rule": p.rule} if p.rule else {}),
            "prompt": p.prompt,
            "base": texts["base"]["prompts"][i],
            "tuned": texts["tuned"]["prompts"][i],
            "base_passed": passed(p, texts["base"]["prompts"][i]),
            "tuned_passed": passed(p, texts["tuned"]["prompts"][i]),
            "kl": kl_rows[i][0] / kl_rows[i][1] if kl_rows[i][1] else 0.0,
        }
        for i, p in enumerate(prompts)
    ]


def _request_rows(requests: list[InstructionRequest], texts: dict) -> list[dict]:
    rows = []
    for i, r in enumerate(requests):
        base, tuned = texts["base"]["requests"][i], texts["tuned"]["requests"][i]
        rows.append({"id": r.id, "task": r.task, "prompt": r.prompt, "instructions": [x.to_dict() for x in r.instructions],
                     "base": base, "tuned": tuned, "base_kept": [follows(x, base) for x in r.instructions],
                     "tuned_kept": [follows(x, tuned) for x in r.instructions]})  # fmt: skip
    return rows


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
    """The report without its per-prompt rows (the answers: a tuned model's may quote the team's sign-off) and server
    paths: for eval.json, demo.json, the model card, the dashboard and the service's evaluation results."""
    return {k: v for k, v in report.items() if k not in ("rows", "choices", "requests", "tuned", "base_model")}


def write_retention(run: str | Path, report: dict) -> Path:
    """RUN/retention.json, written whole or not at all, its remedies in its reader's terms (wording.py)."""
    path = Path(run) / RETENTION_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rendered(report), ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    return path
