"""A base model that answers the general prompts of self-replay cheaply, every load and generation counted (the
replay and forgetting-curve tests)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from finetune.ship.eval import replay


def counting_base(monkeypatch, cache: Path, answer: Callable[[str], str], every_load: bool = False) -> dict:
    """A cache root of the test's own; the base answers each prompt with `answer(prompt)` closed by the stop token
    (the untrained toy rarely stops); its loads by replay (`every_load`: every load of a model) and its generate
    calls counted, with the prompts asked."""
    monkeypatch.setenv("FINETUNE_CACHE", str(cache))
    counted = {"generate": 0, "load": 0, "asked": []}
    model_module = importlib.import_module("finetune.train.model")
    real_load, real_placed = model_module.load_model, replay.load_placed

    def load(*args, **kwargs):
        counted["load"] += 1
        return real_load(*args, **kwargs)

    def placed(*args, **kwargs):
        counted["load"] += 1
        return real_placed(*args, **kwargs)

    def generate(model, tokenizer, prompts, max_new_tokens=96, batch_size=32):
        from finetune.data.prompting import stop_ids

        counted["generate"] += 1
        counted["asked"] += [p[-1]["content"] for p in prompts]
        answers = [answer(p[-1]["content"]) for p in prompts]
        return [[*tokenizer(a, add_special_tokens=False)["input_ids"], stop_ids(tokenizer)[0]] for a in answers]

    if every_load:
        monkeypatch.setattr(model_module, "load_model", load)
    monkeypatch.setattr(replay, "load_placed", placed)  # replay's own name for it
    monkeypatch.setattr(replay, "generate_ids", generate)
    return counted
