"""GGUF in: a .gguf file converts once into a cached folder (same weights, same tokenizer), its facts come from
the header without converting, and a file transformers cannot read gets one sentence naming why."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
import torch
from gguf_fixtures import plain_base, write_gguf

from finetune.commands.cli import main
from finetune.models import gguf as gguf_model
from finetune.models.facts import load_model_facts
from finetune.models.gguf import cache_folder, file_sha256, read_header
from finetune.models.source import origin, resolve_model
from finetune.settings.errors import UserError


@pytest.fixture(scope="module")
def files(tmp_path_factory, toy_model):
    """The toy model (Llama, with a chat template) and a plain Qwen2 base (none), each as a GGUF file."""
    root = tmp_path_factory.mktemp("gguf")
    qwen = plain_base(root / "qwen", "qwen2")
    return {
        "toy": toy_model,
        "toy.gguf": write_gguf(toy_model, root / "toy.gguf"),
        "qwen": qwen,
        "qwen.gguf": write_gguf(qwen, root / "qwen.gguf"),
        "root": root,
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("finetune-cache")


@pytest.fixture(autouse=True)
def _cache(cache, monkeypatch):
    monkeypatch.setenv("FINETUNE_CACHE", str(cache))


def _weights(folder) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


@pytest.mark.parametrize("name", ["toy", "qwen"])
def test_a_gguf_file_converts_to_the_same_weights_and_tokenizer(files, name):
    from transformers import AutoTokenizer

    gguf = files[f"{name}.gguf"]
    folder = resolve_model(str(gguf))
    assert folder == str(cache_folder(file_sha256(gguf)))
    before, after = _weights(files[name]), _weights(folder)
    assert sorted(before) == sorted(after)
    for key, value in before.items():  # F32 in the file: exact, Llama's permuted q/k rows included
        assert torch.equal(value, after[key]), key
    probe = "Hello  there!\t123 ünïcödé 🙂 order number"
    original, converted = AutoTokenizer.from_pretrained(files[name]), AutoTokenizer.from_pretrained(folder)
    assert converted(probe)["input_ids"] == original(probe)["input_ids"]
    assert converted.chat_template == original.chat_template  # the toy's from the file's metadata; Qwen's: none
    assert origin(folder) == {"gguf_file": str(gguf.resolve()), "sha256": file_sha256(gguf)}


def test_the_conversion_is_reused_not_repeated(files, monkeypatch):
    first = resolve_model(str(files["toy.gguf"]))

    def convert_again(*args):
        raise AssertionError("converted a second time")

    monkeypatch.setattr(gguf_model, "_convert", convert_again)
    assert resolve_model(str(files["toy.gguf"])) == first


def test_a_crash_mid_conversion_leaves_nothing_that_looks_complete(files, cache, monkeypatch):
    gguf = files["root"] / "crash.gguf"
    shutil.copy(files["qwen.gguf"], gguf)
    with gguf.open("ab") as f:
        f.write(b"\0" * 32)  # other bytes (the alignment padding llama.cpp allows): another sha256
    real = gguf_model._convert

    def crash(source, header, sha256, out):
        (out / "config.json").write_text("{}")  # half written
        raise OSError("disk full")

    monkeypatch.setattr(gguf_model, "_convert", crash)
    with pytest.raises(OSError, match="disk full"):
        resolve_model(str(gguf))
    folder = cache_folder(file_sha256(gguf))
    assert not folder.exists()
    assert not [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    monkeypatch.setattr(gguf_model, "_convert", real)
    assert resolve_model(str(gguf)) == str(folder)  # the next call converts it whole


def test_the_hash_is_remembered_by_path_size_and_modification_time(files, monkeypatch):
    gguf = files["root"] / "hashed.gguf"
    shutil.copy(files["toy.gguf"], gguf)
    digest = file_sha256(gguf)
    calls = []
    real = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda *a: calls.append(a) or real(*a))
    assert file_sha256(gguf) == digest and calls == []  # remembered: not read again
    os.utime(gguf, ns=(gguf.stat().st_atime_ns, gguf.stat().st_mtime_ns + 10**9))
    assert file_sha256(gguf) == digest and len(calls) == 1  # touched: hashed again


def test_plan_facts_come_from_the_header_without_converting(files, cache):
    gguf = files["root"] / "facts.gguf"
    shutil.copy(files["qwen.gguf"], gguf)
    with gguf.open("ab") as f:
        f.write(b"\0" * 64)
    facts = load_model_facts(str(gguf))
    assert not cache_folder(file_sha256(gguf)).exists()  # nothing converted
    folder_facts = load_model_facts(str(files["qwen"]))
    for field in ("total_params", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "tie_word_embeddings", "attention_bias", "context_length"):  # fmt: skip
        assert getattr(facts, field) == getattr(folder_facts, field), field
    assert facts.context_length == 512 and facts.tie_word_embeddings and facts.exact
    toy = load_model_facts(str(files["toy.gguf"]))
    assert toy.total_params == load_model_facts(str(files["toy"])).total_params and not toy.tie_word_embeddings


def test_an_architecture_transformers_cannot_read_is_one_sentence(files, capsys):
    gguf = write_gguf(files["toy"], files["root"] / "bert.gguf", architecture="bert")
    with pytest.raises(UserError, match="architecture 'bert' is not one transformers can load"):
        resolve_model(str(gguf))
    assert main(["plan", "--examples", "100", "--model", str(gguf)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'bert'" in err and "Traceback" not in err


def test_a_storage_type_the_gguf_package_cannot_dequantize_is_one_sentence(files):
    gguf = write_gguf(files["toy"], files["root"] / "f64.gguf", float64=("output_norm.weight",))
    with pytest.raises(UserError, match="stored as F64, which the gguf package cannot dequantize"):
        resolve_model(str(gguf))


def test_a_file_that_is_not_gguf_is_one_sentence(files):
    fake = files["root"] / "fake.gguf"
    fake.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(UserError, match="not a readable GGUF file"):
        read_header(fake)
    with pytest.raises(UserError, match="no such GGUF file"):
        resolve_model(str(files["root"] / "missing.gguf"))


def test_serve_registers_a_gguf_file_as_its_converted_folder(files):
    from finetune.service.options import parse_models

    models = parse_models([f"toy={files['toy.gguf']}", "hub=Qwen/Qwen2.5-0.5B"])
    assert models == {"toy": resolve_model(str(files["toy.gguf"])), "hub": "Qwen/Qwen2.5-0.5B"}
    assert json.loads((cache_folder(file_sha256(files["toy.gguf"])) / "source.json").read_text())["dtype"] == "float32"
