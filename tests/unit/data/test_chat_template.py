"""--chat-template: auto keeps the model's own template and gives a model without one ChatML (its two special
tokens added where missing); chatml and a Jinja file are used as named; the plan says which and why."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_fixtures import plain_base

from finetune.data.chat_template import CHATML_TOKENS, chatml_template, describe_chat_template
from finetune.data.tokenize import ChatTokenizer, load_tokenizer
from finetune.settings.errors import UserError


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A base model folder whose tokenizer has no chat template and no ChatML tokens."""
    return plain_base(tmp_path_factory.mktemp("plain") / "base")


def test_auto_keeps_the_models_own_template(toy_model):
    tokenizer = load_tokenizer(str(toy_model))
    assert tokenizer.chat_template == chatml_template()  # the toy's own (ChatML too), nothing added
    assert len(tokenizer) == len(load_tokenizer(str(toy_model), chat_template="chatml"))
    assert describe_chat_template(str(toy_model))[0] == "model"


def test_auto_gives_a_model_without_a_template_chatml_with_its_tokens(plain):
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(plain)
    assert not bare.chat_template and not set(CHATML_TOKENS) & set(bare.get_vocab())
    tokenizer = load_tokenizer(str(plain))
    assert len(tokenizer) == len(bare) + 2
    chat = ChatTokenizer(tokenizer)
    assert chat.end_of_turn_text == "<|im_end|>" and chat.end_of_turn_id == len(bare) + 1
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert tokenizer(text, add_special_tokens=False)["input_ids"][0] == len(bare)  # <|im_start|>: one token
    assert load_tokenizer(str(plain)).get_vocab() == tokenizer.get_vocab()  # every load adds them alike
    template, reason = describe_chat_template(str(plain))
    assert template == "chatml" and "has no chat template" in reason


def test_a_jinja_file_is_used_as_named(toy_model, tmp_path):
    jinja = tmp_path / "plain.jinja"
    jinja.write_text(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + ': ' + m['content'] + '<|im_end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant: ' }}{% endif %}"
    )
    tokenizer = load_tokenizer(str(toy_model), chat_template=str(jinja))
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == (
        "<|im_start|>user: hi<|im_end|>"
    )
    assert describe_chat_template(str(toy_model), str(jinja)) == (str(jinja), None)


def test_a_bad_template_setting_is_one_sentence(toy_model, tmp_path):
    with pytest.raises(UserError, match=r"--chat-template .*missing.jinja: not auto, chatml or a readable Jinja file"):
        load_tokenizer(str(toy_model), chat_template=str(tmp_path / "missing.jinja"))
    with pytest.raises(UserError, match="not auto, chatml or a readable Jinja file"):
        describe_chat_template(str(toy_model), "chatm")  # a typo is a missing file, said at plan time
    empty = tmp_path / "empty.jinja"
    empty.write_text("  \n")
    with pytest.raises(UserError, match="the file is empty"):
        load_tokenizer(str(toy_model), chat_template=str(empty))


def test_the_plan_says_which_template_and_why(plain, toy_model, capsys):
    import json

    from finetune.commands.cli import main

    data = str(Path(__file__).resolve().parents[3] / "examples" / "train.jsonl")
    assert main(["plan", data, "--model", str(plain), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["chat_template"] == "chatml" and "ChatML, the documented default" in plan["auto"]["chat_template"]
    assert plan["base_origin"] is None
    assert main(["plan", data, "--model", str(toy_model), "--chat-template", "chatml", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["chat_template"] == "chatml" and "chat_template" not in plan["auto"]
