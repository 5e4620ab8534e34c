"""llama.cpp itself loads an exported model.gguf, tokenizes the held-out prompts as transformers does, and answers
them greedily as the exported folder does. Optional: llama-cpp-python compiles llama.cpp from source to install
(docs/gguf.md has how long that took here), so it is not in the dev extra; without it this module is skipped.
"""

from __future__ import annotations

import pytest
import torch
from gguf_helpers import NEW_TOKENS, held_out_prompts

from finetune.cli import main

llama_cpp = pytest.importorskip("llama_cpp")


def _until_end(tokens: list[int], end: int) -> list[int]:
    return tokens[: tokens.index(end) + 1] if end in tokens else tokens


def _llama_cpp_answers(gguf_file, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """(llama.cpp's tokens for each prompt's text, llama.cpp's greedy answer to each prompt's ids)."""
    model = llama_cpp.Llama(model_path=str(gguf_file), n_ctx=1024, n_threads=2, seed=0, verbose=False)
    tokenized, answers = [], []
    for ids in prompts:
        text = model.detokenize(ids, special=True)
        tokenized.append(model.tokenize(text, add_bos=False, special=True))
        model.reset()
        answer = []
        for token in model.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            answer.append(token)
            if len(answer) == NEW_TOKENS:
                break
        answers.append(answer)
    return tokenized, answers


@pytest.mark.parametrize("gguf_type", ["f32", "f16"])
def test_llama_cpp_answers_like_the_exported_folder(lora_run, tmp_path, gguf_type):
    from transformers import AutoModelForCausalLM

    from finetune.data.tokenize import load_tokenizer

    out = tmp_path / "merged"
    assert main(["export", str(lora_run), "--out", str(out), "--gguf", "--gguf-type", gguf_type]) == 0
    tokenizer = load_tokenizer(str(out))
    prompts = held_out_prompts(tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    end = reference.generation_config.eos_token_id
    expected = []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.no_grad():
            answer = reference.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
        expected.append(_until_end(answer[0, len(ids) :].tolist(), end))
    tokenized, answers = _llama_cpp_answers(out / "model.gguf", prompts)
    assert tokenized == prompts  # llama.cpp splits the text as training did (tokenizer.ggml.pre = gpt-2)
    assert [_until_end(a, end) for a in answers] == expected
