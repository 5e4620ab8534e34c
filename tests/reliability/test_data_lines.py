"""Data lines that once went wrong quietly or expensively: a key said twice, a 50 MB conversation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from finetune.data.read import parse_bytes

GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def test_duplicate_key_is_a_validation_error_with_its_line():
    twice = '{"messages": [{"role": "user", "content": "a", "content": "b"}, {"role": "assistant", "content": "c"}]}'
    parsed = parse_bytes((json.dumps(GOOD) + "\n" + twice + "\n").encode())
    assert [(p.line, p.code) for p in parsed.errors] == [(2, "duplicate_key")]
    assert parsed.errors[0].message == 'the key "content" appears twice in one object; JSON keeps only the last'
    assert len(parsed.conversations) == 1


def test_duplicate_top_level_key_too():
    parsed = parse_bytes(b'{"messages": [], "messages": []}\n')
    assert [p.code for p in parsed.errors] == ["duplicate_key"]


def test_a_50_mb_line_is_refused_before_tokenization_in_bounded_memory(toy_model, tmp_path):
    huge = {"messages": [{"role": "user", "content": "x" * (50 * 2**20)}, {"role": "assistant", "content": "ok"}]}
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(huge) + "\n")
    command = [sys.executable, "-m", "finetune", "validate", str(path), "--model", str(toy_model)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory
        child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 1 and "Traceback" not in output, output
    assert "line_too_long" in output and "50.0 MB" in output, output
    # the child holds the 50 MB file; tokenizing the line used to take 10 GB
    assert usage.ru_maxrss < 1_500_000, f"peak memory {usage.ru_maxrss} KB"


def test_messages_read_as_english():
    lines = [
        '{"messages": {"role": "user"}}',
        '{"messages": [[1], {"role": "assistant", "content": "a"}]}',
        '{"messages": [{"role": "user", "content": {"x": 1}}, {"role": "assistant", "content": "a"}]}',
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, '
        '{"role": "assistant", "content": "b"}]}',
    ]
    parsed = parse_bytes("\n".join(lines).encode() + b"\n")
    text = " | ".join(p.message for p in parsed.errors)
    for wrong in ("a object", "a array", "a assistant"):
        assert wrong not in text, text
    for right in ('"messages" is an object', "is an array", "is an object, not a string", "after an assistant"):
        assert right in text, text
    assert not re.search(r"\b(\w+) \1\b", text), text  # no doubled word
