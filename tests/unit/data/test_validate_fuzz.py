"""Whatever the bytes, validation returns a result: never an exception, never a traceback.

Three kinds of input: raw random bytes, near-JSON (valid lines with random byte mutations), and
random JSON values shaped like chat lines (wrong types, roles, weights in every place).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finetune.data.read import parse_bytes
from finetune.data.validate import run_validate

DOC = Path(__file__).parents[3] / "docs" / "formats.md"
DOCUMENTED = set(re.findall(r"^\| `([a-z_0-9]+)` \| (?:error|warning) \|", DOC.read_text(encoding="utf-8"), re.M))

GOOD_LINES = [
    b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}',
    b'{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, '
    b'{"role": "assistant", "content": "a", "weight": 0.5}]}',
    b'{"prompt": "2+2?", "completion": "4"}',
    b'{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "\\udfff x"}]}',
    b'{"messages": [{"role": "user", "content": "a", "weight": 1e999}, {"role": "assistant", "content": "b"}]}',
    b"",
    b"\xef\xbb\xbf",
]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "", "USER"]) | json_values
arguments = st.sampled_from(['{"a": 1}', "{a: 1}", "[1]", "", "{}"]) | json_values
functions = st.fixed_dictionaries(
    {}, optional={"name": st.sampled_from(["f", "g", ""]) | json_values, "arguments": arguments}
)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {}, optional={"id": st.sampled_from(["c1", "c2"]) | json_values, "type": json_values, "function": functions}
    )
    | json_values,
    max_size=3,
)
parts = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url", "input_audio", "x"])}, optional={"text": json_values}
    ),
    max_size=3,
)
messages = st.dictionaries(
    st.sampled_from(["role", "content", "weight", "name", "tool_calls", "tool_call_id", "function_call"]),
    st.one_of(roles, st.text(max_size=6), st.floats(-1, 2), json_values, tool_calls, parts, functions),
    max_size=5,
)
tools = st.lists(
    st.fixed_dictionaries({"type": json_values, "function": functions}) | functions | json_values, max_size=2
)
chat_lines = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(messages, max_size=5), json_values)},
    optional={
        "prompt": json_values,
        "completion": st.text(max_size=4),
        "extra": json_values,
        "tools": tools | json_values,
        "functions": tools,
        "parallel_tool_calls": json_values,
    },
)
turns = st.dictionaries(
    st.sampled_from(["from", "value", "x"]),
    st.sampled_from(["human", "gpt", "system", "function_call", "observation", "bot"]) | arguments | json_values,
    max_size=3,
)
sharegpt_lines = st.fixed_dictionaries(
    {"conversations": st.lists(turns, max_size=5) | json_values},
    optional={"system": json_values, "tools": st.sampled_from(["", "[]", '[{"name": "f"}]', "{"]) | json_values},
)
alpaca_lines = st.fixed_dictionaries(
    {"instruction": json_values},
    optional={"input": json_values, "output": json_values, "system": json_values, "history": json_values},
)


@st.composite
def near_json(draw) -> bytes:
    """Good lines, then a few bytes flipped, inserted or cut."""
    data = bytearray(b"\n".join(draw(st.lists(st.sampled_from(GOOD_LINES), min_size=1, max_size=6))))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "insert", "cut"]))
        byte = draw(st.integers(0, 255))
        if action == "flip":
            data[at] = byte
        elif action == "insert":
            data.insert(at, byte)
        else:
            del data[at : at + draw(st.integers(1, 8))]
    return bytes(data)


@st.composite
def random_chat_files(draw) -> bytes:
    objects = draw(st.lists(st.one_of(chat_lines, sharegpt_lines, alpaca_lines, json_values), min_size=1, max_size=5))
    return b"\n".join(json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass") for obj in objects)


def check_invariants(data: bytes) -> None:
    parsed = parse_bytes(data, "fuzz.jsonl")
    n_lines = data.count(b"\n") + 1
    assert parsed.ok == (not parsed.errors)
    for problem in parsed.errors + parsed.warnings:
        assert problem.code in DOCUMENTED, problem
        assert problem.line is None or 1 <= problem.line <= n_lines
        assert isinstance(problem.message, str) and problem.message
        problem.message.encode("utf-8")  # printable: no unpaired surrogates leak into messages
    error_lines = {p.line for p in parsed.errors}
    assert all(c.line not in error_lines for c in parsed.conversations)
    json.dumps({"errors": [p.to_dict() for p in parsed.errors]})


# database=None: no .hypothesis/ folder left in the working tree
FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.binary(max_size=300))
def test_random_bytes_never_raise(data: bytes) -> None:
    check_invariants(data)


@FAST
@given(near_json())
def test_near_json_never_raises(data: bytes) -> None:
    check_invariants(data)


@FAST
@given(random_chat_files())
def test_random_chat_shapes_never_raise(data: bytes) -> None:
    check_invariants(data)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), near_json(), random_chat_files()), st.booleans())
def test_run_validate_returns_an_exit_code(data: bytes, as_json: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.jsonl"
        path.write_bytes(data)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = run_validate(str(path), as_json=as_json, show=2, max_seq_len=8)
    assert rc in (0, 1)
    if as_json:
        report = json.loads(out.getvalue())
        assert report["ok"] == (rc == 0)
