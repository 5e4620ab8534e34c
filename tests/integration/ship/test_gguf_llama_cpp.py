"""llama.cpp itself loads an exported model.gguf, tokenizes the held-out prompts as transformers does, computes
the same logits and answers them greedily as the exported folder does: the Llama toy's LoRA run (f32 and f16)
and the Qwen2 / Qwen3 toys' (f16). Optional: llama-cpp-python compiles llama.cpp from source to install
(docs/gguf.md says how long that took here), so it is not in the dev extra; without it this module is skipped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_helpers import NEW_TOKENS, held_out_prompts

from finetune.commands.cli import main

llama_cpp = pytest.importorskip("llama_cpp")

# llama.cpp computes in f32 too, in another order (and its own kernels); f16 weights add their rounding
LOGIT_BOUNDS = {"f32": 1e-3, "f16": 2e-2}


def _until_end(tokens: list[int], end: int) -> list[int]:
    return tokens[: tokens.index(end) + 1] if end in tokens else tokens


def _transformers(folder: Path, prompts: list[list[int]]) -> tuple[list[np.ndarray], list[list[int]], int]:
    """The exported folder's logits for each prompt, its greedy answers, and its end-of-turn id."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    end = model.generation_config.eos_token_id
    logits, answers = [], []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.no_grad():
            logits.append(model(input_ids=x).logits[0].numpy())
            out = model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
        answers.append(_until_end(out[0, len(ids) :].tolist(), end))
    return logits, answers, end


def _llama_cpp(gguf_file: Path, prompts: list[list[int]], end: int):
    """llama.cpp's tokens for each prompt's text, its logits for the prompt's ids, and its greedy answer."""
    model = llama_cpp.Llama(model_path=str(gguf_file), n_ctx=1024, n_threads=2, seed=0, logits_all=True, verbose=False)
    tokenized, logits, answers = [], [], []
    for ids in prompts:
        text = model.detokenize(ids, special=True)
        tokenized.append(model.tokenize(text, add_bos=False, special=True))
        model.reset()
        model.eval(ids)
        logits.append(np.array(model.scores[: len(ids)]))
        answer = []
        for token in model.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            answer.append(token)
            if len(answer) == NEW_TOKENS or token == end:
                break
        answers.append(_until_end(answer, end))
    return tokenized, logits, answers


def _check(run: Path, tmp_path: Path, gguf_type: str) -> None:
    from finetune.data.tokenize import load_tokenizer

    out = tmp_path / "merged"
    assert main(["export", str(run), "--out", str(out), "--gguf", "--gguf-type", gguf_type]) == 0
    prompts = held_out_prompts(load_tokenizer(str(out)))
    logits, answers, end = _transformers(out, prompts)
    tokenized, cpp_logits, cpp_answers = _llama_cpp(out / "model.gguf", prompts, end)
    assert tokenized == prompts  # llama.cpp splits the text as training did (tokenizer.ggml.pre)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(logits, cpp_logits, strict=True))
    print(f"llama.cpp {gguf_type}: max |logit difference| {worst:.3g}")  # shown with -s
    assert worst <= LOGIT_BOUNDS[gguf_type]
    assert cpp_answers == answers
    assert any(len(answer) > 1 for answer in answers)  # not every answer stops at once: the comparison says something


@pytest.mark.parametrize("gguf_type", ["f32", "f16"])
def test_llama_cpp_reads_the_llama_toy_like_transformers(lora_run, tmp_path, gguf_type):
    _check(lora_run, tmp_path, gguf_type)


def test_llama_cpp_reads_the_qwen_toys_like_transformers(qwen_lora_run, tmp_path):
    _check(qwen_lora_run, tmp_path, "f16")
