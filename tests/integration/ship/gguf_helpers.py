"""What the GGUF tests share: the held-out prompts, greedy answers, transformers' reading of a file, its metadata."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from finetune.prompting import prompt_ids

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


def read_back(folder: Path, gguf_file: Path, answers: bool = True) -> dict:
    """The folder's model and transformers' reading of the GGUF file, on the same held-out prompts
    (with `answers`, also both models' greedy answers)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune.data.tokenize import load_tokenizer

    tokenizer = load_tokenizer(str(folder))
    prompts = held_out_prompts(tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    loaded.eval()
    gguf_tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    worst = 0.0
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            worst = max(worst, (reference(input_ids=x).logits - loaded(input_ids=x).logits).abs().max().item())
    encoded = [gguf_tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"] for ids in prompts]
    return {
        "max_abs_diff": worst,
        "same_tokens": encoded == prompts,
        "answers": [_greedy(reference, ids) for ids in prompts] if answers else None,
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
