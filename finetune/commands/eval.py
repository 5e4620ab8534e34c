"""`finetune eval`: read the answers, and measure them. Base vs tuned (and vs any kept checkpoint).

    finetune eval TEST.jsonl --model BASE --tuned OUT/adapter|OUT/model     a test file and two models
    finetune eval RUN [--test FILE] [--checkpoints] [--rule NAME=REGEX ...]  a run: its base, its final
                                                  weights and (--checkpoints) every kept checkpoint, on the
                                                  run's own test set (train --test-fraction) or --test FILE
    finetune eval RUN --retention                 also: did tuning cost the base what it knew? (retention.py)
                                                  RUN/retention.json, and a `retention` section in eval.json
                                                  and eval.html; a run without a test set gets the check alone
                                                  (so does one with --retention-only)

For each held-out conversation the final assistant message is the reference; every model answers the
conversation before it (greedy). Numbers per example and overall (metrics.py): exact match, token F1,
ROUGE-L, answer length, the rate of each `--rule`, and the win rate over the base on the rules. The best
and worst examples by token F1 are shown beside the reference. A run writes RUN/eval.json and
RUN/eval.html (or --out DIR). Overlap numbers reward the team's wording, not correctness: read answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from finetune.data.read import read_file
from finetune.data.team_context import bound_conversation
from finetune.data.tokenize import load_tokenizer
from finetune.placement.load import grow_vocabulary, load_adapted, load_placed
from finetune.placement.stages import recorded_in, stage
from finetune.placement.where import Placement, for_model, of_run
from finetune.settings.errors import UserError
from finetune.settings.wording import rendered
from finetune.ship.eval.evaluation_estimate import TEST_BATCH, say_estimate
from finetune.ship.eval.general_answers import generate_batches
from finetune.ship.eval.generate import prompt_messages, style_rate
from finetune.ship.eval.grounding import MEASURES as GROUNDING
from finetune.ship.eval.grounding import REFERENCE, cell, measure, training_replies_of
from finetune.ship.eval.grounding import line as grounding_line
from finetune.ship.eval.html import render_html
from finetune.ship.eval.metrics import parse_rules, rule_win_rate, score, summarize, token_f1  # noqa: F401 (API)
from finetune.ship.eval.progress import counting, progress_lines
from finetune.ship.eval.retention import LABELS, check_retention, points, write_retention
from finetune.ship.eval.retention import summary as retention_summary
from finetune.ship.eval.retention_verdict import cut_sentence
from finetune.ship.eval.test_split import TEST_FILE
from finetune.ship.export.card import refresh_run_card
from finetune.ship.run_folder import (
    checkpoint_steps,
    is_run_folder,
    load_for_generation,
    locate_weights,
    read_json,
    team_system_of,
)

FILE_MODE_LIMIT = 20  # conversations answered from a test file when --limit is not given


@dataclass
class Candidate:
    name: str  # "base", "tuned", "step-120"
    source: str  # what was loaded, for the record
    load: Callable[[], object]
    step: int | None = None  # the run's step these weights are from, when known


def _validation_losses(run: Path) -> dict[int, float]:
    """{step: val_loss} from the run's metrics.jsonl, so answers and validation loss can be read side by side."""
    losses: dict[int, float] = {}
    try:
        lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return losses
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("val_loss") is not None and isinstance(row.get("step"), int):
            losses[row["step"]] = row["val_loss"]
    return losses


def _final_step(run: Path) -> int | None:
    """The step of the run's final weights: the best checkpoint when the report says so, else the last step."""
    report = read_json(run / "report.json")
    step = report.get("best_step") if report.get("final_is_best") else report.get("steps_taken")
    return step if isinstance(step, int) else None


def load_tuned(base: str, tuned: str, placement: Placement | None = None):
    """A LoRA adapter folder on top of the base, or a full model folder, placed (by default as a run of the base
    on this machine would be: placement/where.for_model)."""
    placement = placement or for_model(base)
    if (Path(tuned) / "adapter_config.json").exists():
        with_tokenizer = (Path(tuned) / "tokenizer_config.json").exists()  # training may have added tokens (ChatML)
        return load_adapted(base, tuned, placement, len(load_tokenizer(tuned)) if with_tokenizer else None)
    return load_placed(tuned, placement)


@dataclass
class EvalRequest:
    data: str
    model: str | None = None
    tuned: str | None = None
    limit: int | None = None
    max_new_tokens: int = 128
    as_json: bool = False
    markers: tuple[str, ...] = ()
    test: str | None = None
    checkpoints: bool = False
    rules: tuple[str, ...] = ()
    out: str | None = None
    show: int = 3
    retention: bool = False
    retention_only: bool = False  # the retention check alone, even when the run has a test set
    retention_limit: int | None = None  # general prompts, requests and questions the retention check asks (a subset)


def _run_candidates(request: EvalRequest) -> tuple[str, str, list[Candidate], Path]:
    """(test file, tokenizer folder, models, output folder) for `finetune eval RUN`."""
    run = Path(request.data)
    final = locate_weights(run)
    base = request.model or final.base
    test = request.test or str(run / TEST_FILE)
    if request.test and not Path(request.test).is_file():
        raise UserError(f"--test: {request.test} is not a file")
    if not Path(test).exists():
        raise UserError(f"{run} has no test set ({TEST_FILE}): pass --test FILE, or train with --test-fraction F")
    placement = of_run(run)  # every model in the run's precision, on its device
    trusted = final.trust_remote_code
    candidates = [Candidate("base", base, lambda: load_placed(base, placement, trust_remote_code=trusted))]
    if request.tuned:
        candidates.append(Candidate("tuned", request.tuned, lambda: load_tuned(base, request.tuned, placement)))
    else:
        tuned_from = str(final.adapter or final.model)
        tuned = lambda: load_for_generation(final, placement)[0]  # noqa: E731
        candidates.append(Candidate("tuned", tuned_from, tuned, _final_step(run)))
    if request.checkpoints:
        steps = checkpoint_steps(run)
        if not steps:
            raise UserError(f"{run} keeps no checkpoints to score")
        for step in steps:
            weights = locate_weights(run, step)
            where = str(weights.adapter or weights.model)
            load = lambda w=weights: load_for_generation(w, placement)[0]  # noqa: E731
            candidates.append(Candidate(f"step-{step}", where, load, step))
    return test, final.tokenizer, candidates, Path(request.out or run)


def _file_candidates(request: EvalRequest) -> tuple[str, str, list[Candidate], Path | None]:
    if request.checkpoints:
        raise UserError("--checkpoints scores a run's checkpoints: pass the run folder (finetune eval RUN)")
    if not request.model:
        raise UserError(f"{request.data} is a test file: pass the base model with --model (or give a run folder)")
    if request.test:
        raise UserError("--test goes with a run folder: finetune eval RUN --test FILE")
    model, tuned = request.model, request.tuned
    placement = for_model(model)  # this machine's device, Auto's precision for the model
    candidates = [Candidate("base", model, lambda: load_placed(model, placement))]
    if tuned:
        candidates.append(Candidate("tuned", tuned, lambda: load_tuned(model, tuned, placement)))
    tokenizer = tuned if tuned and (Path(tuned) / "tokenizer_config.json").exists() else model
    return request.data, tokenizer, candidates, Path(request.out) if request.out else None


def _read_test(path: str, limit: int | None):
    parsed = read_file(path)
    if not parsed.ok:
        raise UserError(f"{path} is not usable; run `finetune validate {path}` to see why")
    conversations = [c for c in parsed.conversations if c.messages[-1].role == "assistant"]
    if limit is not None:
        conversations = conversations[:limit]
    if not conversations:
        raise UserError(f"{path}: no conversation ends with an assistant reply to compare with")
    return conversations


def _answers(model, tokenizer, conversations: list, max_new_tokens: int) -> list[str]:
    """generate_answers' answers, a batch at a time, each batch said when done."""
    prompts = [prompt_messages(c) for c in conversations]
    rows = generate_batches(model, tokenizer, prompts, max_new_tokens, TEST_BATCH, "test conversations")
    return [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in rows]


def _check(request: EvalRequest) -> None:
    limits = (
        ("--limit", request.limit, 1),
        ("--show", request.show, 0),
        ("--retention-limit", request.retention_limit, 1),
    )
    for flag, value, least in limits:
        if value is not None and value < least:
            raise UserError(f"{flag} must be at least {least}, got {value}")
    if request.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {request.max_new_tokens}")


def evaluate(request: EvalRequest) -> tuple[dict, Path | None]:
    """Answer, score and summarize; returns (eval.json's content, the folder to write it to or None)."""
    _check(request)
    run_mode = is_run_folder(request.data)
    test, tokenizer_home, candidates, out = (_run_candidates if run_mode else _file_candidates)(request)
    rules = parse_rules(list(request.rules))
    conversations = _read_test(test, request.limit if (run_mode or request.limit) else FILE_MODE_LIMIT)
    if run_mode and (system := team_system_of(request.data)):  # the team's prompts in the context it trained with
        conversations = [bound_conversation(c, system) for c in conversations]
    references = [c.messages[-1].content for c in conversations]
    tokenizer = load_tokenizer(tokenizer_home)

    answers: dict[str, list[str]] = {}
    for candidate in candidates:
        model = candidate.load()
        grow_vocabulary(model, len(tokenizer))  # the base, when the run's tokenizer added tokens (ChatML)
        where = recorded_in(out if run_mode else None)  # RUN/stages.jsonl: where it ran
        with counting(f"Test set, {candidate.name}"), where, stage(f"eval: {candidate.name}") as seen:  # per batch
            seen.model(model)
            answers[candidate.name] = _answers(model, tokenizer, conversations, request.max_new_tokens)
    scores = {name: [score(a, r, rules) for a, r in zip(got, references, strict=True)] for name, got in answers.items()}
    summary = {name: summarize(rows) for name, rows in scores.items()}
    if request.markers:
        for name, got in answers.items():
            summary[name]["style_rate"] = style_rate(got, list(request.markers))
    grounding, checked = measure(
        conversations, answers, training_replies_of(request.data) if run_mode else (None, None)
    )
    rows = [
        {"line": c.line, "prompt": c.messages[-2].content if len(c.messages) > 1 else "", "reference": ref}
        | {name: got[i] for name, got in answers.items()}
        | {"scores": {name: s[i] for name, s in scores.items()}, "grounding": {k: v[i] for k, v in checked.items()}}
        for i, (c, ref) in enumerate(zip(conversations, references, strict=True))
    ]
    primary = "tuned" if "tuned" in answers else "base"
    ordered = sorted(range(len(rows)), key=lambda i: (scores[primary][i]["token_f1"], -i))
    pick = min(request.show, len(rows))

    def example(i: int) -> dict:
        row = rows[i]
        return {
            "line": row["line"],
            "prompt": row["prompt"],
            "reference": row["reference"],
            "answer": row[primary],
            "base": row["base"],
            "token_f1": scores[primary][i]["token_f1"],
        }

    val_losses = _validation_losses(Path(request.data)) if run_mode else {}
    result = {
        "test_file": str(test),
        "examples": len(rows),
        "models": {c.name: c.source for c in candidates},
        "steps": {c.name: c.step for c in candidates if c.step is not None},
        "val_loss": {c.name: val_losses[c.step] for c in candidates if c.step in val_losses},
        "rules": {name: rule.pattern for name, rule in rules.items()},
        "summary": summary,
        "grounding": rendered(grounding),  # its remedies name settings in this process's terms (a worker's: the API's)
        "win_rate": {
            name: rule_win_rate(scores["base"], s, list(rules)) for name, s in scores.items() if name != "base"
        }
        if rules
        else {},
        "ranked_by": f"token_f1 of {primary}",
        "best": [example(i) for i in reversed(ordered[-pick:])] if pick else [],
        "worst": [example(i) for i in ordered[:pick]],
        "rows": rows,
    }
    return result, out


def write_outputs(result: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, ensure_ascii=False, indent=2), encoding="utf-8")
    (out / "eval.html").write_text(render_html(result), encoding="utf-8")
    return out / "eval.json", out / "eval.html"


def _has_test_set(request: EvalRequest) -> bool:
    return bool(request.test) or (Path(request.data) / TEST_FILE).exists()


def _check_retention(request: EvalRequest) -> dict:
    """The retention report of a run, written to RUN/retention.json; its remedies in this reader's terms."""
    report = check_retention(request.data, limit=request.retention_limit)
    report["file"] = str(write_retention(request.data, report))
    return rendered(report)


def run_eval(request: EvalRequest) -> int:
    if request.retention and not is_run_folder(request.data):
        raise UserError("--retention compares a run with its base: pass the run folder (finetune eval RUN --retention)")
    if request.retention_only and not request.retention:
        raise UserError("--retention-only goes with --retention: add it, or drop --retention-only")
    if request.retention_limit is not None and not request.retention:
        raise UserError("--retention-limit goes with --retention: add it, or drop --retention-limit")
    evaluates = not request.retention or (_has_test_set(request) and not request.retention_only)
    with progress_lines():  # the estimate, then a line per batch, on stderr
        if is_run_folder(request.data):  # a file evaluation has no plan to size it by
            say_estimate(Path(request.data), request.retention, evaluates, request.retention_limit, request.limit)
        result, out = evaluate(request) if evaluates else (None, None)
        retention = _check_retention(request) if request.retention else None
    if result is not None and retention is not None:
        result["retention"] = retention_summary(retention)
    written = write_outputs(result, out) if result is not None and out is not None else None
    if written or retention is not None:
        _refresh_card(Path(request.data))
    if request.as_json:
        print(json.dumps(result if result is not None else retention_summary(retention), ensure_ascii=False, indent=2))
        return 0
    if result is not None:
        _print(result, written)
    elif retention is not None and request.retention_only:
        print("only the retention check ran (--retention-only)")
    elif retention is not None:
        print(f"{request.data} has no test set: only the retention check ran (train with --test-fraction F or pass")
        print("--test FILE to compare the answers with the team's too).")
    if retention is not None:
        print_retention(retention)
    return 0


def _refresh_card(run: Path) -> None:
    """The card in the run's adapter/ or model/ folder carries the new numbers (a run folder only)."""
    if is_run_folder(run):
        refresh_run_card(run)


def print_retention(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    report = rendered(report)  # its message and remedies name settings as flags here
    console = Console(highlight=False)
    table = Table(
        title="Retention: the base and the tuned model on the general set (95% intervals; DROP, RISE: beyond chance "
        "with Holm's correction across the measures)"
    )
    for column in ("", "prompts", "base", "tuned", "change (points)"):
        table.add_column(column, justify="left" if not column else "right")
    for key, name in LABELS.items():
        numbers = report.get(key) or {"n": 0}
        if not numbers["n"]:
            continue
        base, tuned, change = numbers["base"], numbers["tuned"], numbers["change"]
        table.add_row(
            name,
            str(numbers["n"]),
            f"{base['rate']:.0%} ({base['low']:.0%}-{base['high']:.0%})",
            f"{tuned['rate']:.0%} ({tuned['low']:.0%}-{tuned['high']:.0%})",
            f"{points(change['value'])} ({points(change['low'])} to {points(change['high'])})"
            + (" DROP" if numbers.get("dropped") else "")
            + (" RISE" if numbers.get("rose") else ""),
        )
    console.print(table)
    if moved := _instructions_moved(report.get("by_instruction") or {}):
        console.print(f"instructions kept, by kind (base -> tuned): {moved}")
    console.print(
        f"mean KL(tuned || base) per token on the base's own answers: {report['kl']['mean_per_token']:.4g} nats"
    )
    if cut := cut_sentence(report.get("cut_at_cap")):
        console.print(cut)
    console.print(f"[bold red]{report['message']}[/bold red]" if report["flag"] else report["message"])
    for remedy in report["remedies"]:
        console.print(f"  - {remedy}")
    console.print(f"written: {report['file']} ({report['seconds']['total']:.0f} s)", soft_wrap=True)  # a whole path


def _instructions_moved(by_instruction: dict, most: int = 6) -> str:
    """The instruction kinds whose keeping changed most, largest drop first: 'postscript 64% -> 27%, ...'."""
    moved = sorted(by_instruction.items(), key=lambda kv: kv[1]["tuned"] - kv[1]["base"])[:most]
    return ", ".join(f"{kind} {v['base']:.0%} -> {v['tuned']:.0%}" for kind, v in moved)


def _numbers_table(result: dict):
    """One row per metric, one column per model: fits a terminal with several checkpoints."""
    from rich.table import Table

    models = list(result["summary"])
    metrics = list(next(iter(result["summary"].values())))
    table = Table(title=f"{result['examples']} held-out conversations ({result['test_file']})")
    table.add_column("")
    for name in models:
        table.add_column(name, justify="right")
    for metric in metrics:
        table.add_row(metric, *(f"{result['summary'][name][metric]:.3f}" for name in models))
    if result["win_rate"]:
        wins = [result["win_rate"].get(name) for name in models]
        table.add_row(
            "rule win rate vs base (w/t/l)",
            *(f"{w['win_rate']:.0%} ({w['wins']}/{w['ties']}/{w['losses']})" if w else "" for w in wins),
        )
    if result["val_loss"]:
        losses = [result["val_loss"].get(name) for name in models]
        table.add_row("validation loss", *(f"{loss:.4f}" if loss is not None else "" for loss in losses))
    return table


def _grounding_table(section: dict):
    """Answers the team would sign (grounding.py): one row per measure, one column per model and the references."""
    from rich.table import Table

    table = Table(title=f"Answers the team would sign, on {section['answers']} held-out prompts (95% intervals)")
    table.add_column("")
    for name in section["models"]:
        table.add_column("team's replies" if name == REFERENCE else name, justify="right")
    for key, label in GROUNDING.items():
        table.add_row(label, *(cell(key, models[key]) for models in section["models"].values()))
    return table


def print_grounding(section: dict, console) -> None:
    """The table, the one line, and the remedies when the tuned model invents or recites beyond chance."""
    section = rendered(section)  # its remedies name settings as flags here
    console.print(_grounding_table(section))
    console.print(f"answers: {grounding_line(section)}", style="bold red" if section["flag"] else None, markup=False)
    for remedy in section["remedies"]:
        console.print(f"  - {remedy}", markup=False)


def _print(result: dict, written: tuple[Path, Path] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    models = list(result["summary"])
    if len(result["rows"]) <= FILE_MODE_LIMIT:
        table = Table(show_lines=True, expand=True)
        for column in ("prompt", "reference", *models):
            table.add_column(column, ratio=1)
        for row in result["rows"]:
            table.add_row(*(str(row[k])[:500] for k in ("prompt", "reference", *models)))
        console.print(table)
    console.print(_numbers_table(result))
    print_grounding(result["grounding"], console)
    for title, examples in (("best", result["best"]), ("worst", result["worst"])):
        for ex in examples:
            console.print(f"[bold]{title}[/bold] (line {ex['line']}, F1 {ex['token_f1']:.2f}) {ex['prompt'][:200]}")
            console.print(f"  reference: {ex['reference'][:300]}")
            console.print(f"  answer:    {ex['answer'][:300]}")
    if written:
        console.print(f"written: {written[0]} and {written[1]}")
    console.print("Overlap rewards the team's wording, not correctness: read the answers.")
