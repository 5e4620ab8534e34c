"""ChatML added to a base without it: load_model grows the embeddings alike on every load, LoRA trains the new
rows (in an untied output layer too), and the adapter, saved with its embeddings, loads back on the base."""

from __future__ import annotations

import pytest
import torch
from gguf_fixtures import plain_base

from finetune.data.tokenize import load_tokenizer
from finetune.train.model import NEW_TOKEN_ROWS, add_lora, load_model


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def plain(request, tmp_path_factory):
    """Untied (Llama) and tied (Qwen2) bases with no chat template; and their tokenizer with ChatML added."""
    folder = plain_base(tmp_path_factory.mktemp(request.param) / "base", request.param)
    return folder, load_tokenizer(str(folder))


def test_the_embeddings_grow_alike_on_every_load(plain):
    folder, tokenizer = plain
    rows = len(tokenizer) - 2
    one, two = load_model(str(folder), vocab_size=len(tokenizer)), load_model(str(folder), vocab_size=len(tokenizer))
    embeddings = one.get_input_embeddings().weight
    assert embeddings.shape[0] == len(tokenizer) == one.config.vocab_size
    assert torch.equal(embeddings, two.get_input_embeddings().weight)
    assert torch.equal(one.get_output_embeddings().weight, two.get_output_embeddings().weight)
    new = embeddings[rows:]
    assert not torch.equal(new[0], new[1])  # two new tokens start apart
    assert (new - embeddings[:rows].mean(0)).abs().max() < 0.1 * embeddings[:rows].std()
    assert getattr(one, NEW_TOKEN_ROWS) == [rows, rows + 1]
    same = load_model(str(folder), vocab_size=rows)  # big enough already: untouched
    assert same.get_input_embeddings().weight.shape[0] == rows and not hasattr(same, NEW_TOKEN_ROWS)


def test_lora_trains_the_new_rows_and_the_adapter_loads_back(plain, tmp_path):
    from peft import PeftModel

    folder, tokenizer = plain
    rows = len(tokenizer) - 2
    model = add_lora(load_model(str(folder), vocab_size=len(tokenizer)), 4, 8.0, 0.0, seed=0)
    tied = model.config.tie_word_embeddings
    expected = {"embed_tokens": [rows, rows + 1]} | ({} if tied else {"lm_head": [rows, rows + 1]})
    assert model.peft_config["default"].trainable_token_indices == expected
    ids = torch.tensor([[rows, 5, 6, rows + 1, 7]])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    before_in = model.get_input_embeddings()(ids).detach().clone()
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(before_in[0, 0], model.get_input_embeddings()(ids)[0, 0])  # <|im_start|> learned
    model.save_pretrained(tmp_path / "adapter")
    model.eval()
    with torch.no_grad():
        expected_logits = model(input_ids=ids).logits
    loaded = PeftModel.from_pretrained(load_model(str(folder), vocab_size=len(tokenizer)), tmp_path / "adapter")
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, expected_logits, atol=1e-6)
    merged = loaded.merge_and_unload()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, expected_logits, atol=1e-5)
