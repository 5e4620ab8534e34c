"""Data lines that once went wrong quietly or expensively: a key said twice, a 50 MB conversation."""

from __future__ import annotations

import json
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
    # Linux counts the memory of the process that started a child into the child's peak (the address space it
    # replaces at exec); the test process may hold gigabytes by now, so a small interpreter starts the command
    # and reports its child's peak (KB) on the last line
    measure = (
        "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
    )
    child = subprocess.run([sys.executable, "-c", measure, *command], capture_output=True, text=True)
    *lines, peak_kb = child.stdout.splitlines()
    output = "\n".join(lines) + child.stderr
    assert child.returncode == 1 and "Traceback" not in output, output
    assert "line_too_long" in output and "50.0 MB" in output, output
    # the command holds the 50 MB file; tokenizing the line used to take 10 GB
    assert int(peak_kb) < 1_500_000, f"peak memory {peak_kb} KB"


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


def _gzip_bomb(path, inflated_mib: int) -> None:
    """A valid gzip file whose second line inflates to `inflated_mib` MiB: 1 MiB members, concatenated (gzip
    allows it), so it is made in milliseconds and is about a thousandth of that size on disk."""
    import gzip

    head = gzip.compress((json.dumps(GOOD) + '\n{"messages": [{"role": "user", "content": "').encode())
    member = gzip.compress(b"x" * 2**20, compresslevel=9)
    path.write_bytes(head + member * inflated_mib)


# Runs a command and prints its peak memory: measured from a small process of its own, since a child forked
# from pytest would count pytest's memory (torch included) as its own.
_MEASURE = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.returncode); print(done.stdout + done.stderr)"
)


def _peak_rss_kb(command: list[str]) -> tuple[int, str, int]:
    """(exit code, output, peak memory in KB) of `command`."""
    done = subprocess.run([sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True, check=True)
    first, _, output = done.stdout.partition("\n")
    peak, code = first.split()
    return int(code), output, int(peak)


def test_a_gzip_bomb_is_refused_while_decompressing_in_bounded_memory(tmp_path):
    """1 MB on disk, one line of 1 GiB once inflated: reading stops 4 MB into that line (it used to inflate the
    whole file, then split it: twice its size in memory)."""
    bomb = tmp_path / "bomb.jsonl.gz"
    _gzip_bomb(bomb, 1024)
    assert bomb.stat().st_size < 2 * 2**20
    code, output, peak = _peak_rss_kb([sys.executable, "-m", "finetune", "validate", str(bomb)])
    assert peak < 300_000, f"peak memory {peak} KB"
    assert code == 1 and "Traceback" not in output, output
    assert f"{bomb}:2 [line_too_long]" in output and "reading stopped there" in output, output


def test_a_gzip_bomb_stops_train_in_one_message_in_bounded_memory(tmp_path, toy_model):
    bomb = tmp_path / "bomb.jsonl.gz"
    _gzip_bomb(bomb, 1024)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "finetune", "train", str(bomb), "--model", str(toy_model), "--out", str(out)]
    code, output, peak = _peak_rss_kb(command)
    assert peak < 1_000_000, f"peak memory {peak} KB"  # torch and the model are most of it
    assert code == 1 and "Traceback" not in output, output
    assert f"{bomb}:2 [line_too_long]" in output, output
