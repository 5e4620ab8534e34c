"""Self-replay's model side: the shipped general prompts answered by the base model itself, once, cached.

    mixed = mix_replay(config, out, tokenizer)     # None when replay is off; else the config reading the mix

The base answers each training prompt (data/replay_mix.py: the shipped prompts minus the held-out slice)
greedily with the run's chat template, at most MAX_NEW_TOKENS new tokens; only answers that end (a stop token
came) are kept, so no row teaches the model to stop mid-sentence. The answers are cached under
`<cache root>/replay/<key>.jsonl`, the key covering the model's identity, the chat template, the prompts' digest
and these generation settings: the next run on the same base reads them and loads no model. A team's own
general conversations (`general_data`) are used instead when given. The rows then join the team's training
conversations at the run's ratio (data/replay_mix.write_mixed): ordinary targets, trained on like the team's, but
the product's own work: not billed (the plan shows their tokens and time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from finetune.data import replay_mix
from finetune.data.prompting import stop_ids
from finetune.settings import caches
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import model_identity
from finetune.settings.wording import ref
from finetune.ship.eval.generate import generate_ids
from finetune.train.model import load_model

log = logging.getLogger("finetune")
MAX_NEW_TOKENS = 256
GENERATION = {"decoding": "greedy", "max_new_tokens": MAX_NEW_TOKENS, "kept": "finished answers", "version": 1}
FOLDER = "replay"


def cache_key(config: RunConfig, tokenizer, held_out: bool = False) -> str:
    """The model, its chat template (as the run renders it), the prompts (and which slice) and the generation
    settings."""
    identity = {
        "model": model_identity(config.model),
        "chat_template": [config.chat_template, getattr(tokenizer, "chat_template", None)],
        "prompts": replay_mix.prompts_digest(),
        "generation": GENERATION,
    }
    if held_out:  # a key of its own; the training slice's key is what it always was (its cache stays valid)
        identity["slice"] = "held out"
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def base_answers(config: RunConfig, tokenizer, held_out: bool = False) -> list[dict]:
    """Chat rows (a user prompt, the base's answer): from the cache, else generated once and cached. The
    training slice by default; `held_out`: the slice never trained on (a general validation set: how far the
    tuned model drifts from the base's own answers)."""
    path = caches.root() / FOLDER / f"{cache_key(config, tokenizer, held_out)}.jsonl"
    if path.is_file():
        log.info("replay answers read from the cache (%s)", path)
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    rows = _generate(config, tokenizer, held_out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=caches.TEMP_SUFFIX)
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    os.replace(tmp, path)
    return rows


def _generate(config: RunConfig, tokenizer, held_out: bool = False) -> list[dict]:
    prompts = replay_mix.held_out_prompts() if held_out else replay_mix.training_prompts()
    log.info("answering %d general prompts with the base model (once per base; cached)", len(prompts))
    model = load_model(config.model, trust_remote_code=config.trust_remote_code, vocab_size=len(tokenizer))
    messages = [[{"role": "user", "content": p.text}] for p in prompts]
    stops = set(stop_ids(tokenizer))
    rows = []
    for prompt, ids in zip(prompts, generate_ids(model, tokenizer, messages, MAX_NEW_TOKENS), strict=True):
        answer = tokenizer.decode(ids, skip_special_tokens=True).strip()
        if ids and ids[-1] in stops and answer:
            rows.append(
                {"messages": [{"role": "user", "content": prompt.text}, {"role": "assistant", "content": answer}]}
            )
    if not rows:
        raise UserError(
            f"{ref('replay')}: the base model finished none of {len(prompts)} general answers within "
            f"{MAX_NEW_TOKENS} tokens; give your own general conversations with {ref('general_data')}"
        )
    return rows


def mix_replay(
    config: RunConfig, out: Path | None, tokenizer, write: bool = True, total_params: int | None = None
) -> replay_mix.Mixed | None:
    """The run's training files with replay rows mixed in (OUT/replay/), or None when replay is off (or Auto turned
    it off for this base, whose size is `total_params`); `write=False`: what they hold, without writing them (another
    rank of the run)."""
    ratio, _ = replay_mix.replay_ratio(config, total_params)
    if ratio <= 0:
        return None
    if config.general_data:
        rows, source = replay_mix.general_rows(config.general_data), str(config.general_data)
    else:
        rows, source = base_answers(config, tokenizer), "base model"
    folder = out / FOLDER if out is not None else Path(tempfile.mkdtemp(prefix=replay_mix.SCRATCH_PREFIX))
    return replay_mix.write_mixed(config, folder, rows, ratio, source, write)
