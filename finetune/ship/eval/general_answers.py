"""One model's answers to the retention check's general set: greedy answers, longer answers, multiple-choice picks.

    items = GeneralItems(prompts, requests, choices)
    answers = answers_of(model, tokenizer, items, settings)             # one side, computed
    answers, cached = base_answers_cached(key, lambda: answers_of(...))  # the base's, once per base and set

The base model's side of the check is the same for every run of that base (a LoRA run's base is its adapter
switched off, whose weights are the base's), so it is computed once and cached under
`<cache root>/retention/<key>.json`, the key covering the base's identity, its chat template, its vocabulary, the
set's digest and the generation settings. The tuned side is computed every time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass

from finetune.data import prompting
from finetune.settings import caches
from finetune.ship.eval.general_set import Choice, GeneralPrompt, InstructionRequest
from finetune.ship.eval.progress import batch_done

FOLDER = "retention"
VERSION = 1  # of the answers' computation: a change that alters them changes it


@dataclass(frozen=True)
class GeneralItems:
    prompts: list[GeneralPrompt]
    requests: list[InstructionRequest]
    choices: list[Choice]


@dataclass(frozen=True)
class Settings:
    max_new_tokens: int  # short answers (the general prompts)
    request_tokens: int  # longer answers (the instruction requests)
    batch_size: int
    score_batch: int


@dataclass
class Answers:
    prompt_ids: list[list[int]]  # new token ids per general prompt (the base's are the KL's teacher-forced answers)
    request_ids: list[list[int]]  # new token ids per instruction request
    picks: list[int]  # the option found most likely, per multiple-choice question


def cut_at_cap(answers: dict[str, Answers], settings: Settings, stops: list[int]) -> dict:
    """Per side, the share of answers cut at the token cap (no end-of-turn within it), short answers and longer ones
    apart: a cut answer fails an instruction on its end (a postscript, an end phrase) without being wrong, and a
    model that adds a greeting and a sign-off is cut more often (retention.json's `cut_at_cap`)."""

    def share(rows: list[list[int]], cap: int) -> dict:
        cut = sum(1 for ids in rows if len(ids) >= cap and ids[-1] not in stops)
        return {"cut": cut, "n": len(rows), "share": cut / len(rows) if rows else 0.0}

    return {
        kind: {"cap": cap} | {name: share(getattr(side, field), cap) for name, side in answers.items()}
        for kind, field, cap in (("prompts", "prompt_ids", settings.max_new_tokens),
                                 ("requests", "request_ids", settings.request_tokens))
    }  # fmt: skip


def answers_of(model, tokenizer, items: GeneralItems, settings: Settings, choice_rows: list, pad_id: int) -> Answers:
    """Greedy answers of `model` to the prompts and requests, and its multiple-choice picks."""
    from finetune.ship.eval.likelihood import target_log_probs  # torch: the dashboard and the card read the report side

    prompt_ids = generate_batches(model, tokenizer, [p.messages() for p in items.prompts], settings.max_new_tokens,
                                  settings.batch_size, "general prompts")  # fmt: skip
    request_ids = generate_batches(model, tokenizer, [r.messages() for r in items.requests], settings.request_tokens,
                                   settings.batch_size, "requests for a longer answer")  # fmt: skip
    scores = target_log_probs(model, choice_rows, pad_id, batch_size=settings.score_batch) if choice_rows else []
    means, at, picks = [sum(s) / len(s) for s in scores], 0, []
    for choice in items.choices:
        options = means[at : at + len(choice.options)]
        picks.append(max(range(len(options)), key=options.__getitem__))
        at += len(choice.options)
    return Answers(prompt_ids, request_ids, picks)


def generate_batches(
    model, tokenizer, prompts: list[list[dict]], max_new_tokens: int, batch_size: int, what: str
) -> list[list[int]]:
    """generate_ids' answers, a batch at a time (its own batches: the prompts in order of length), each batch said
    when done (progress.py: `finetune eval`'s lines, an evaluation's job events)."""
    from finetune.ship.eval.generate import generate_ids  # torch: as above

    lengths = [len(prompting.prompt_ids(tokenizer, messages)) for messages in prompts]
    order = sorted(range(len(prompts)), key=lambda i: (lengths[i], i))
    answers: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        rows = generate_ids(model, tokenizer, [prompts[i] for i in chosen], max_new_tokens, batch_size)
        for index, row in zip(chosen, rows, strict=True):
            answers[index] = row
        batch_done(what, start + len(chosen), len(order))
    return answers


def cache_key(base_identity: dict, tokenizer, digest: str, items: GeneralItems, settings: Settings) -> str:
    identity = {
        "base": base_identity,
        "chat_template": getattr(tokenizer, "chat_template", None),
        "vocabulary": len(tokenizer),
        "set": digest,
        "items": [[p.id for p in items.prompts], [r.id for r in items.requests], [c.id for c in items.choices]],
        "settings": asdict(settings),
        "version": VERSION,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def base_answers_cached(key: str, compute: Callable[[], Answers]) -> tuple[Answers, bool]:
    """(the base's answers, whether they came from the cache): computed and cached when not there yet."""
    path = caches.root() / FOLDER / f"{key}.json"
    if path.is_file():
        try:
            return Answers(**json.loads(path.read_text(encoding="utf-8"))), True
        except (ValueError, TypeError):
            pass  # a damaged entry: computed again and replaced
    answers = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=caches.TEMP_SUFFIX)
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(asdict(answers)))
    os.replace(tmp, path)
    return answers, False
