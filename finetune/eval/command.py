"""`finetune eval TEST.jsonl --model BASE --tuned OUT/adapter|OUT/model`: read answers, base vs tuned.

Loss says how well a model predicts the team's replies; this shows the replies themselves. For each
held-out conversation the final assistant message is the reference; both models answer the
conversation before it (greedy). The overlap with the reference (token F1, as in SQuAD) is printed
as a rough, honest number: it rewards the team's wording, not correctness.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from finetune.errors import UserError


def token_f1(answer: str, reference: str) -> float:
    """Harmonic mean of word precision and recall against the reference (case-insensitive)."""
    got, want = re.findall(r"\w+", answer.lower()), re.findall(r"\w+", reference.lower())
    common = sum((Counter(got) & Counter(want)).values())
    if not got or not want or not common:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


def load_tuned(base: str, tuned: str):
    """A LoRA adapter folder on top of the base, or a full model folder."""
    from finetune.train.model import load_model

    if (Path(tuned) / "adapter_config.json").exists():
        from peft import PeftModel

        return PeftModel.from_pretrained(load_model(base), tuned)
    return load_model(tuned)


def run_eval(
    data: str, model: str, tuned: str | None, limit: int, max_new_tokens: int, as_json: bool, markers: list[str]
) -> int:
    from rich.console import Console
    from rich.table import Table

    from finetune.data.read import read_file
    from finetune.data.tokenize import load_tokenizer
    from finetune.eval.generate import generate_answers, style_rate
    from finetune.train.model import load_model

    parsed = read_file(data)
    if not parsed.ok:
        raise UserError(f"{data} is not usable; run `finetune validate {data}` to see why")
    conversations = [c for c in parsed.conversations if c.messages[-1].role == "assistant"][:limit]
    if not conversations:
        raise UserError(f"{data}: no conversation ends with an assistant reply to compare with")
    references = [c.messages[-1].content for c in conversations]
    tokenizer = load_tokenizer(tuned if tuned and (Path(tuned) / "tokenizer_config.json").exists() else model)

    answers = {"base": generate_answers(load_model(model), tokenizer, conversations, max_new_tokens)}
    if tuned:
        answers["tuned"] = generate_answers(load_tuned(model, tuned), tokenizer, conversations, max_new_tokens)

    summary = {
        name: {
            "token_f1": sum(map(token_f1, got, references)) / len(references),
            **({"style_rate": style_rate(got, markers)} if markers else {}),
        }
        for name, got in answers.items()
    }
    rows = [
        {"line": c.line, "prompt": c.messages[-2].content if len(c.messages) > 1 else "", "reference": ref}
        | {name: got[i] for name, got in answers.items()}
        for i, (c, ref) in enumerate(zip(conversations, references, strict=True))
    ]
    if as_json:
        print(json.dumps({"examples": len(rows), "summary": summary, "rows": rows}, ensure_ascii=False, indent=2))
        return 0
    console = Console(highlight=False)
    table = Table(show_lines=True, expand=True)
    for column in ("prompt", "reference", *answers):
        table.add_column(column, ratio=1)
    for row in rows:
        table.add_row(*(str(row[k])[:500] for k in ("prompt", "reference", *answers)))
    console.print(table)
    for name, numbers in summary.items():
        extra = f", style {numbers['style_rate']:.0%}" if "style_rate" in numbers else ""
        console.print(f"{name}: word overlap with the reference (token F1) {numbers['token_f1']:.2f}{extra}")
    console.print("Overlap rewards the team's wording, not correctness: read the answers.")
    return 0
