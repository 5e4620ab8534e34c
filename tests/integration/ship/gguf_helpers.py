"""What the GGUF tests share: the held-out prompts, greedy answers, transformers' reading of a file, its metadata."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from finetune.data.prompting import prompt_ids

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PROMPTS = 8
NEW_TOKENS = 12


def held_out_prompts(tokenizer) -> list[list[int]]:
    """The first 8 test conversations up to their last user turn, as the chat template renders them."""
    rows = [json.loads(line) for line in (EXAMPLES / "test.jsonl").read_text().splitlines()[:PROMPTS]]
    return [prompt_ids(tokenizer, row["messages"][:-1]) for row in rows]


def _greedy(model, ids: list[int]) -> list[int]:
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )
    return out[0, len(ids) :].tolist()


@functools.lru_cache(maxsize=4)
def _reference(folder: str) -> tuple[list[list[int]], list[torch.Tensor], list[list[int]], list[str]]:
    """The exported folder's prompts, logits, greedy answers and prompt texts: once per folder, for every file type."""
    from transformers import AutoModelForCausalLM

    from finetune.data.tokenize import load_tokenizer

    tokenizer = load_tokenizer(folder)
    prompts = held_out_prompts(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = [model(input_ids=torch.tensor([ids])).logits for ids in prompts]
    return prompts, logits, [_greedy(model, ids) for ids in prompts], [tokenizer.decode(ids) for ids in prompts]


def read_back(folder: Path, gguf_file: Path, answers: bool = True) -> dict:
    """transformers' reading of the GGUF file against the exported folder, on the same held-out prompts: the
    largest logit difference, whether the file's tokenizer encodes the prompts alike, and (`answers`) both
    models' greedy answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts, logits, expected, texts = _reference(str(folder))
    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    loaded.eval()
    gguf_tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    with torch.no_grad():
        worst = max(
            (logit - loaded(input_ids=torch.tensor([ids])).logits).abs().max().item()
            for ids, logit in zip(prompts, logits, strict=True)
        )
    return {
        "max_abs_diff": worst,
        "same_tokens": [gguf_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] == prompts,
        "answers": expected if answers else None,
        "gguf_answers": [_greedy(loaded, ids) for ids in prompts] if answers else None,
    }


def metadata(gguf_file: Path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(gguf_file)
    fields = {
        name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.ggml.t")
    }
    fields["tensor types"] = {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}
    return fields
