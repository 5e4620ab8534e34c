"""A hostile chat template, from `--chat-template FILE`, a hub folder's tokenizer_config.json or a GGUF's metadata,
is refused in one sentence naming where it came from, before any data is tokenized, exit 1, no traceback, in
seconds and bounded memory (issue 35). Before: a nested range(100000) loop ran until killed, a string-doubling
loop took `validate` to 19.5 GB and a MemoryError traceback, and a sandbox refusal or a syntax error ended in two
tracebacks."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time

import pytest
from reliability_helpers import TRAIN, assert_clean_failure, cli, run_cli

CHAT = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
NESTED_RANGE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + CHAT
DOUBLING = "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}" + CHAT
FORBIDDEN = "{{ messages.__class__.__mro__ }}" + CHAT
SYNTAX = "{% for m in messages %}<|im_start|>{{ m.role }\n{{ m.content }}<|im_end|>\n{% endfor %}"
MEMORY = 4 * 2**30  # address space for the child: a normal `validate --model` runs in it; the doubling needed 19.5 GB


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _validate(
    tmp_path, model, *extra: str, command: str = "validate", data=TRAIN
) -> tuple[subprocess.CompletedProcess, float]:
    """`finetune validate TRAIN --model MODEL ...` in a new interpreter, its memory capped (so a template that
    is not bounded fails here with a MemoryError, not by filling the machine), its time too (one that loops for
    ever fails by the timeout); and how long it took."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "FINETUNE_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "finetune", command, str(data), "--model", str(model), *extra]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, preexec_fn=_limit_memory)
    return result, time.monotonic() - started


def _one_sentence(result: subprocess.CompletedProcess, *words: str) -> str:
    assert_clean_failure(result, *words)
    progress = "Converting and de-quantizing GGUF tensors"  # transformers' own bar, while a GGUF converts
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(progress)]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _template(tmp_path, text: str, name: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_nested_range_loops_end_in_one_sentence_naming_the_file(tmp_path, toy_model):
    file = _template(tmp_path, NESTED_RANGE, "nested.jinja")
    result, seconds = _validate(tmp_path, toy_model, "--chat-template", file)
    _one_sentence(result, f"--chat-template {file}: the chat template was refused: it ran too long")
    assert seconds < 60  # 3.9 s (16 s under load), as long as a plain `validate --model` (3.7 s)


def test_string_doubling_ends_in_one_sentence_naming_the_file(tmp_path, toy_model):
    file = _template(tmp_path, DOUBLING, "doubling.jinja")
    result, seconds = _validate(tmp_path, toy_model, "--chat-template", file)
    _one_sentence(result, f"--chat-template {file}: the chat template was refused: it built a text of over")
    assert seconds < 60  # 3.4 s, 322 MB at peak (a plain `validate --model`: 3.7 s, 335 MB)


def test_a_forbidden_attribute_is_one_sentence(tmp_path, toy_model):
    file = _template(tmp_path, FORBIDDEN, "forbidden.jinja")
    result = cli("validate", str(TRAIN), "--model", str(toy_model), "--chat-template", file)
    _one_sentence(result, f"--chat-template {file}: the chat template was refused: access to attribute '__class__'")


def test_a_syntax_error_is_one_sentence_with_its_line(tmp_path, toy_model):
    file = _template(tmp_path, SYNTAX, "syntax.jinja")
    result = cli("validate", str(TRAIN), "--model", str(toy_model), "--chat-template", file)
    _one_sentence(result, f"--chat-template {file}: not a valid Jinja template: line 1: unexpected '}}'")


FAILING = {  # issue 42: each printed a 23-62-line traceback from the first render
    "division.jinja": ("{{ 1/0 }}" + CHAT, "fails on a plain conversation (a user message, then an assistant reply): "
                       "division by zero (ZeroDivisionError)"),
    "raises.jinja": ("{{ raise_exception('Conversations must alternate user/assistant/user/assistant') }}" + CHAT,
                     "fails on a plain conversation (a user message, then an assistant reply): it raised "
                     "'Conversations must alternate user/assistant/user/assistant'"),
    "undefined.jinja": ("{{ messages[0].metadata.channel }}" + CHAT,
                        "fails on a plain conversation (a user message, then an assistant reply): 'dict object' has "
                        "no attribute 'metadata' (UndefinedError)"),
    "silent.jinja": ("{% for m in messages %}{% endfor %}<|im_end|>",
                     "renders no message of a plain conversation (a user message, then an assistant reply)"),
}  # fmt: skip


@pytest.mark.parametrize("name", FAILING)
def test_a_template_that_fails_while_rendering_is_one_sentence_naming_it(tmp_path, toy_model, name):
    text, problem = FAILING[name]
    file = _template(tmp_path, text, name)
    for command in ("validate", "plan"):
        result = cli(command, str(TRAIN), "--model", str(toy_model), "--chat-template", file)
        _one_sentence(result, f"--chat-template {file}: the chat template {problem}")


def test_train_with_a_template_that_fails_while_rendering_stops_in_one_sentence(tmp_path, toy_model):
    file = _template(tmp_path, FAILING["raises.jinja"][0], "raises.jinja")
    out = tmp_path / "run"
    result = run_cli("train", str(TRAIN), "--model", str(toy_model), "--chat-template", file, "--out", str(out))
    _one_sentence(result, f"--chat-template {file}: the chat template fails on a plain conversation")
    assert not out.exists()


def test_train_refuses_before_the_data_is_tokenized(tmp_path, toy_model):
    file = _template(tmp_path, FORBIDDEN, "forbidden.jinja")
    out = tmp_path / "run"
    result = cli("train", str(TRAIN), "--model", str(toy_model), "--chat-template", file, "--out", str(out))
    _one_sentence(result, f"--chat-template {file}: the chat template was refused")
    assert not out.exists()


def _hub_folder(tmp_path, toy_model, template: str):
    """The toy model as a hub folder whose template is tokenizer_config.json's chat_template."""
    folder = tmp_path / "hub-model"
    shutil.copytree(toy_model, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return folder


def test_a_hub_folders_own_hostile_template_is_named_by_its_file(tmp_path, toy_model):
    folder = _hub_folder(tmp_path, toy_model, NESTED_RANGE)
    result, seconds = _validate(tmp_path, folder)
    _one_sentence(result, f"the chat template in {folder}'s tokenizer_config.json: the chat template was refused")
    assert seconds < 60


def test_a_ggufs_own_hostile_template_is_named_by_its_metadata(tmp_path, toy_model):
    from gguf_fixtures import write_gguf

    source = tmp_path / "source"
    shutil.copytree(toy_model, source)
    (source / "chat_template.jinja").write_text(DOUBLING)
    gguf = write_gguf(source, tmp_path / "hostile.gguf")
    result, seconds = _validate(tmp_path, gguf)
    _one_sentence(result, f"the chat template in {gguf}'s metadata (tokenizer.chat_template): the chat template")
    assert seconds < 90  # the GGUF converts first


def test_a_template_that_goes_over_on_one_record_stops_at_that_line(tmp_path, toy_model):
    """The probe passes; the bomb is only in conversations of more than six messages. Every record could cost the
    whole budget, so the first that goes over ends the command, naming it."""
    long = [{"role": ("user", "assistant")[i % 2], "content": f"message {i}"} for i in range(8)]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"messages": m}) for m in (long[:2], long, long)) + "\n")
    bomb = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    file = _template(tmp_path, "{% if messages|length > 6 %}" + bomb + "{% endif %}" + CHAT, "late.jinja")
    for command in ("validate", "plan"):
        result, _ = _validate(tmp_path, toy_model, "--chat-template", file, command=command, data=data)
        _one_sentence(result, f"--chat-template {file}: the chat template was refused at line 2: it ran too long")
