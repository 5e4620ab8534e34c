"""The token cache: reused when nothing that changes tokens changed, never trusted otherwise, safe to delete."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from finetune.data import cache
from finetune.data.prepare import prepare_data
from finetune.data.tokenize import load_tokenizer
from finetune.settings.config import RunConfig

LINES = [
    {
        "messages": [
            {"role": "user", "content": f"question {i} " * (i % 5 + 1)},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    }
    for i in range(40)
]


@pytest.fixture(scope="module")
def tokenizer(toy_model):
    return load_tokenizer(str(toy_model))


@pytest.fixture
def run(tmp_path, tokenizer):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    store = tmp_path / "cache"

    def prepare(tok=None, **settings):
        config = RunConfig(data=str(data), **{"cache_dir": str(store), **settings})
        return prepare_data(config, tok or tokenizer)

    prepare.data, prepare.store = data, store
    return prepare


def _entries(store) -> list:
    """The token entries (the small entries of whole lengths, Auto's max_seq_len is chosen from, left out)."""
    return sorted(p for p in store.iterdir() if (p / "ids.npy").exists()) if store.exists() else []


def _lengths_entries(store) -> list:
    return sorted(p for p in store.iterdir() if (p / "lengths.npy").exists()) if store.exists() else []


def test_second_run_reads_the_cache_even_with_other_hyperparameters(run):
    first = run()
    assert not first.from_cache and len(_entries(run.store)) == 1
    again = run(lr=1e-3, epochs=5, batch_size=3, method="full", out="elsewhere")
    assert again.from_cache and again.cache_entry == first.cache_entry
    assert again.train == first.train and again.val == first.val and again.summary == first.summary


@pytest.mark.parametrize(
    "change",
    [{"max_seq_len": 12}, {"seed": 1}, {"val_fraction": 0.5}, {"record_policy": "last"}, {"truncation": "drop"}],
)
def test_a_setting_that_changes_tokens_is_a_new_key(run, change):
    run()
    changed = run(**change)
    assert not changed.from_cache and len(_entries(run.store)) == 2


def test_changed_data_bytes_are_a_new_key(run):
    run()
    with open(run.data, "a") as f:
        f.write(json.dumps(LINES[0] | {"messages": LINES[0]["messages"][:1] + [LINES[1]["messages"][1]]}) + "\n")
    assert not run().from_cache


def test_a_changed_auto_limit_is_a_new_key_and_tokenizes_again(run, tmp_path, monkeypatch):
    """Auto's max_seq_len depends on more than the data (the model's context window, the device's memory): the
    key holds the limit as resolved, so another resolved limit never reads tokens fitted to the old one."""
    first = run()
    assert first.summary.max_seq_len == max(first.train.lengths.max(), first.val.lengths.max())
    assert len(_lengths_entries(run.store)) == 1
    assert run().from_cache  # the same resolved limit: found without tokenizing
    window = tmp_path / "config.json"
    window.write_text(json.dumps({"max_position_embeddings": first.summary.max_seq_len - 5}))
    from finetune.data import parallel

    tokenized = []
    original = parallel.tokenize_conversations
    monkeypatch.setattr(parallel, "tokenize_conversations", lambda *a, **k: tokenized.append(1) or original(*a, **k))
    smaller = run(model=str(window))
    assert not smaller.from_cache and smaller.cache_entry != first.cache_entry and tokenized
    assert smaller.summary.max_seq_len < first.summary.max_seq_len
    assert max(smaller.train.lengths.max(), smaller.val.lengths.max()) <= smaller.summary.max_seq_len
    assert len(_entries(run.store)) == 2 and len(_lengths_entries(run.store)) == 1  # the lengths are shared
    assert run(model=str(window)).from_cache


def test_another_chat_template_is_a_new_key(run, tokenizer):
    run()
    other = copy.deepcopy(tokenizer)
    other.chat_template = other.chat_template.replace("<|im_start|>", "<|im_start|> ")
    assert cache.tokenizer_fingerprint(other) != cache.tokenizer_fingerprint(tokenizer)
    assert not run(other).from_cache


def test_no_cache_writes_nothing(run):
    prepared = run(cache=False)
    assert not prepared.from_cache and prepared.cache_entry is None and not _entries(run.store)


def test_an_entry_whose_key_does_not_match_is_not_trusted(run):
    first = run()
    meta_path = _entries(run.store)[0] / "meta.json"
    content = json.loads(meta_path.read_text())
    content["key"]["settings"]["max_seq_len"] = 99  # an entry that claims another key sits in this key's folder
    meta_path.write_text(json.dumps(content))
    again = run()
    assert not again.from_cache and again.train == first.train


def test_a_damaged_entry_is_tokenized_again(run):
    expected = list(run().train)
    entry = _entries(run.store)[0]
    ids = entry / "ids.npy"
    ids.write_bytes(ids.read_bytes()[:-8])  # cut short
    again = run()
    assert not again.from_cache and again.train == expected
    assert run().from_cache  # and the replacement entry is whole


def test_deleting_the_cache_any_time_is_safe(run):
    first = run()
    in_use = run()  # memory-maps the entry's files
    shutil.rmtree(run.store)
    assert in_use.train == first.train  # mapped files outlive their folder
    assert not run().from_cache and run().from_cache


def test_an_unwritable_cache_location_only_costs_the_cache(run, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    prepared = run(cache_dir=str(blocked / "cache"))
    assert not prepared.from_cache and prepared.cache_entry is None and prepared.summary.counted_with_tokenizer


def test_default_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "root"))
    assert cache.cache_root(RunConfig()) == tmp_path / "root" / "tokens"  # the one cache root's tokens/ folder
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "env"))  # deprecated, still honoured for one release
    assert cache.cache_root(RunConfig()) == tmp_path / "env"
    assert cache.cache_root(RunConfig(cache_dir=str(tmp_path / "flag"))) == tmp_path / "flag"
    monkeypatch.delenv(cache.ENV_DIR)
    monkeypatch.delenv("FINETUNE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root(RunConfig()) == tmp_path / "xdg" / "finetune" / "tokens"


def test_every_setting_is_in_the_key_unless_declared_not_to_touch_the_data():
    from finetune.settings.registry import tokenizing_settings

    key_settings = set(tokenizing_settings())
    assert {"max_seq_len", "truncation", "record_policy", "val_fraction", "seed", "format"} <= key_settings
    assert not {"lr", "epochs", "batch_size", "lora_rank", "out", "model", "data"} & key_settings
    assert "strict" not in key_settings  # it raises or not; the records are the same
