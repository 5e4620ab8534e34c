"""Self-replay's model side: the shipped general prompts answered by the base model itself, as many as the run needs.

    mixed = mix_replay(config, out, tokenizer)     # None when replay is off; else the config reading the mix

The run needs `replay_count(ratio, team rows it reads)` replay rows (data/replay_mix.py). The base answers the training
prompts (the shipped prompts minus the held-out slice) in a seeded order, CHUNK at a time, until that many answers
have finished (a stop token came within MAX_NEW_TOKENS: no row teaches the model to stop mid-sentence); the held-out
slice (the forgetting curve, the adapter scale's probe) is answered whole. Every answer, finished or not, is cached
per prompt under `<cache root>/replay/<key>.jsonl` as each batch arrives (a run stopped during generation keeps what
it answered), the key covering the model's identity, the chat template and these generation settings: a later run on
the same base reads what it needs and answers only prompts never asked. Before answering, the log says how many prompts
and about how long (an estimate), then a line per batch (a service worker turns these into the job's events); the plan
records what was answered and how long it took. A plan that trains nothing generates nothing (replay_preview.py counts
the rows). A team's own general conversations (`general_data`) are used instead when given. The rows then join the
team's training conversations at the run's ratio (data/replay_mix.write_mixed): trained on like the team's, but the
product's own work: not billed (the plan shows their tokens and time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from finetune.data import replay_mix
from finetune.data.prompting import prompt_ids
from finetune.models.facts import load_model_facts
from finetune.placement.decode import generate_ids, stops_of
from finetune.placement.load import load_placed
from finetune.placement.stages import stage
from finetune.placement.where import of_config
from finetune.rules.auto import MAX_EFFECTIVE_BATCH
from finetune.rules.cost import device_flops, generation_seconds
from finetune.rules.memory import resolve_device
from finetune.settings import caches
from finetune.settings.config import AUTO, RunConfig
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import model_identity
from finetune.settings.wording import ref
from finetune.ship.eval.progress import tell

log = logging.getLogger("finetune")
MAX_NEW_TOKENS = 256
CHUNK = 32  # prompts answered at a time (one generation batch) until enough answers have finished
GENERATION = {
    "decoding": "greedy",
    "max_new_tokens": MAX_NEW_TOKENS,
    "cached": "every answer, per prompt",
    "version": 2,
}
FOLDER = "replay"


@dataclass
class Answered:
    """The base's answers a run asked for: chat rows of the finished ones, and what answering cost."""

    rows: list[dict]  # {"messages": [user prompt, the base's answer]}, in the order asked
    asked: int  # prompts whose answers the run read (from the cache or answered now)
    answered: int  # of them answered now (0: every one from the cache)
    seconds: float  # spent answering now

    def to_dict(self) -> dict:
        return {"prompts": self.asked, "answered_now": self.answered, "from_cache": self.asked - self.answered,
                "finished": len(self.rows), "seconds": round(self.seconds, 1)}  # fmt: skip


def cache_key(config: RunConfig, tokenizer) -> str:
    """The model (its weights' digest), its chat template (as the run renders it), the generation settings, and where
    they run: the device kind, the precision and the torch and transformers versions (placement/where.py)."""
    identity = {
        "model": model_identity(config.model),
        "chat_template": [config.chat_template, getattr(tokenizer, "chat_template", None)],
        "generation": GENERATION,
        "placement": of_config(config).cache_key(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cache_path(config: RunConfig, tokenizer) -> Path:
    return caches.root() / FOLDER / f"{cache_key(config, tokenizer)}.jsonl"


def all_cached(config: RunConfig, tokenizer, prompts: list[str]) -> bool:
    """Whether the base's answers to every one of `prompts` are cached already."""
    cached = _read_cache(cache_path(config, tokenizer))
    return all(p in cached for p in prompts)


def cached_answers(config: RunConfig, tokenizer) -> dict[str, str | None]:
    """{prompt: the base's cached answer, None when it did not finish}: what a plan counts without generating."""
    return _read_cache(cache_path(config, tokenizer))


def base_answers(config: RunConfig, tokenizer, held_out: bool = False) -> list[dict]:
    """Chat rows (a user prompt, the base's finished answer): the held-out slice whole (the forgetting curve and the
    adapter scale's probe: never trained on), or the training slice whole."""
    prompts = replay_mix.held_out_prompts() if held_out else replay_mix.training_prompts()
    return answer_prompts(config, tokenizer, [p.text for p in prompts], None).rows


def answer_prompts(config: RunConfig, tokenizer, prompts: list[str], needed: int | None) -> Answered:
    """The base's answers to `prompts`, in order, until `needed` have finished (all of them: None); cached ones are
    read, the others answered (CHUNK at a time while only some are needed) and added to the cache."""
    path = cache_path(config, tokenizer)
    cached = _read_cache(path)
    rows, asked, new, model, started = [], 0, {}, None, time.perf_counter()
    size, most = CHUNK, len(prompts)  # CHUNK at a time, each cached as it arrives: a run stopped keeps its answers
    while asked < len(prompts) and (needed is None or len(rows) < needed):
        chunk = prompts[asked : asked + size]
        missing = [p for p in chunk if p not in cached]
        if missing:
            if model is None:
                most = _say_cost(config, tokenizer, prompts[asked:], cached, needed, len(rows))
                model = load_placed(config.model, of_config(config), trust_remote_code=config.trust_remote_code,
                                    vocab_size=len(tokenizer))  # fmt: skip
            new |= _answer(model, tokenizer, missing)
            cached |= new
            _append_cache(path, {p: cached[p] for p in missing})
            _say_progress(len(new), max(most, len(new)), time.perf_counter() - started)
        rows += [_row(p, cached[p]) for p in chunk if cached[p] is not None]
        asked += len(chunk)
    if not rows:
        raise UserError(
            f"{ref('replay')}: the base model finished none of {asked} general answers within "
            f"{MAX_NEW_TOKENS} tokens; give your own general conversations with {ref('general_data')}"
        )
    return Answered(rows, asked, len(new), time.perf_counter() - started if new else 0.0)


def _row(prompt: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def _answer(model, tokenizer, prompts: list[str]) -> dict[str, str | None]:
    """{prompt: the base's answer, or None when it did not finish within MAX_NEW_TOKENS}."""
    stops = stops_of(model, tokenizer)
    messages = [[{"role": "user", "content": p}] for p in prompts]
    answers = {}
    with stage("base answers") as seen:  # the run's stages.jsonl: where the base answered
        seen.model(model)
        answered = generate_ids(model, tokenizer, messages, MAX_NEW_TOKENS)
    for prompt, ids in zip(prompts, answered, strict=True):
        answer = tokenizer.decode(ids, skip_special_tokens=True).strip()
        answers[prompt] = answer if ids and ids[-1] in stops and answer else None
    return answers


def _say_cost(config: RunConfig, tokenizer, left: list[str], cached: dict, needed: int | None, have: int) -> int:
    """Log, before paying it, how many prompts the base will answer at most and about how long that takes; that
    number."""
    unknown = [p for p in left if p not in cached]
    most = len(unknown) if needed is None else min(len(unknown), max(CHUNK, 2 * (needed - have)))
    seconds = generation_estimate(config, tokenizer, unknown[:most])
    estimate = f", about {round(seconds / 60) or '<1'} min at most (an estimate)" if seconds is not None else ""
    tell(f"The base model answers up to {most} general prompts before the first step{estimate}; once per base: "
          "cached for later runs", {"prompts": most, "estimated_s": seconds})  # fmt: skip
    return most


def _say_progress(answered: int, most: int, seconds: float) -> None:
    """A line per batch while the base answers (the command line's log, a job's events)."""
    tell(f"The base model answered {answered} of up to {most} general prompts ({seconds:.0f} s)",
          {"answered": answered, "prompts": most, "seconds": round(seconds, 1)})  # fmt: skip


def generation_estimate(config: RunConfig, tokenizer, prompts: list[str]) -> float | None:
    """Seconds the base takes to answer `prompts` at most (each to the MAX_NEW_TOKENS cap, CHUNK at a time), at the
    plan's device's rate; None when the model's size is unknown."""
    params = _parameters(config)
    if not params or not prompts:
        return 0.0 if params else None
    tokens = sum(len(prompt_ids(tokenizer, [{"role": "user", "content": p}])) for p in prompts)
    calls = -(-len(prompts) // CHUNK) * (MAX_NEW_TOKENS + 1)
    return round(generation_seconds(params, tokens + len(prompts) * MAX_NEW_TOKENS, calls, _rate(config)), 1)


def _parameters(config: RunConfig) -> int | None:
    facts = load_model_facts(config.model)
    return facts.total_params if facts else None


def _rate(config: RunConfig) -> float:
    device, _, _ = resolve_device(config.gpu)
    return device_flops(device)


def _read_cache(path: Path) -> dict[str, str | None]:
    if not path.is_file():
        return {}
    entries = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
            entries[entry["prompt"]] = entry["answer"]
        except (ValueError, KeyError, TypeError):
            continue  # a damaged line: that prompt is answered again
    return entries


def _append_cache(path: Path, entries: dict[str, str | None]) -> None:
    """Add answers to the cache as they arrive, durably (written through to the disk): one write of whole lines, so
    runs sharing a base append side by side; a line a killed run left cut is closed first (and read as damaged)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"prompt": p, "answer": a}, ensure_ascii=False) + "\n" for p, a in entries.items())
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        cut = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        data = (("\n" if cut else "") + lines).encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def rows_read(config: RunConfig, team_rows: int) -> int:
    """The team's training rows a run reads, at most: all of them, or what `max_steps` steps of the run's effective
    batch hold (Auto's batch is at most MAX_EFFECTIVE_BATCH)."""
    if config.max_steps is None:
        return team_rows
    batch = (
        MAX_EFFECTIVE_BATCH
        if config.batch_size == AUTO
        else int(config.batch_size) * config.grad_accum * config.devices
    )
    return min(team_rows, config.max_steps * batch)


def mix_replay(
    config: RunConfig, out: Path, tokenizer, write: bool = True, total_params: int | None = None
) -> replay_mix.Mixed | None:
    """The run's training files with replay rows mixed in (OUT/replay/), or None when replay is off (or Auto turned
    it off for this base, whose size is `total_params`); `write=False`: what they hold, without writing them (another
    rank of the run)."""
    ratio, _ = replay_mix.replay_ratio(config, total_params)
    if ratio <= 0:
        return None
    train, _, _ = replay_mix.team_split(config)
    needed = replay_mix.replay_count(ratio, rows_read(config, len(train)))
    answered = None
    if config.general_data:
        rows, source = replay_mix.general_rows(config.general_data), str(config.general_data)
    else:
        order = [p.text for p in replay_mix.training_prompts()]
        random.Random(f"replay-{config.seed}").shuffle(order)
        answered = answer_prompts(config, tokenizer, order, needed)
        rows, source = answered.rows, "base model"
    folder = out / FOLDER  # a plan without an output folder counts the rows instead (replay_preview.py)
    mixed = replay_mix.write_mixed(config, folder, rows, ratio, source, write, count=needed)
    return mixed if answered is None else dataclasses.replace(mixed, generated=answered.to_dict())
