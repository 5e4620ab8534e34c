"""Every format, from the examples in its own project's documentation; detection, --format, .gz, Parquet, convert."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.data.read import parse_bytes, read_file
from finetune.settings.errors import UserError

# ----------------------------------------------------------------------------- the documented examples

# OpenAI fine-tuning guide: the chat format with weights ("Marv").
OPENAI_MARV = {
    "messages": [
        {"role": "system", "content": "Marv is a factual chatbot that is also sarcastic."},
        {"role": "user", "content": "What's the capital of France?"},
        {"role": "assistant", "content": "Paris", "weight": 0},
        {"role": "user", "content": "Can you be more sarcastic?"},
        {"role": "assistant", "content": "Paris, as if everyone doesn't know that already.", "weight": 1},
    ]
}
WEATHER_SCHEMA = {
    "name": "get_current_weather",
    "description": "Get the current weather",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The city and country, eg. San Francisco, USA"},
            "format": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["location", "format"],
    },
}
WEATHER_ARGUMENTS = '{"location": "San Francisco, USA", "format": "celsius"}'
# OpenAI fine-tuning guide: tool calling.
OPENAI_TOOLS = {
    "messages": [
        {"role": "user", "content": "What is the weather in San Francisco?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_id",
                    "type": "function",
                    "function": {"name": "get_current_weather", "arguments": WEATHER_ARGUMENTS},
                }
            ],
        },
    ],
    "tools": [{"type": "function", "function": WEATHER_SCHEMA}],
}
# OpenAI fine-tuning guide: the legacy function-calling form.
OPENAI_FUNCTIONS = {
    "messages": [
        {"role": "user", "content": "What is the weather in San Francisco?"},
        {"role": "assistant", "function_call": {"name": "get_current_weather", "arguments": WEATHER_ARGUMENTS}},
    ],
    "functions": [WEATHER_SCHEMA],
}
# LLaMA-Factory data/README.md: ShareGPT (supervised fine-tuning).
SHAREGPT_DOC = {
    "conversations": [
        {"from": "human", "value": "human instruction"},
        {"from": "gpt", "value": "model response"},
        {"from": "human", "value": "human instruction"},
        {"from": "gpt", "value": "model response"},
    ],
    "system": "system prompt (optional)",
    "tools": "",
}
# LLaMA-Factory's tool-call demo data (glaive_toolcall): function_call and observation turns, tools as JSON text.
SHAREGPT_TOOLS = {
    "conversations": [
        {"from": "human", "value": "Hi, I need a new password. Can you generate one with 12 characters?"},
        {"from": "function_call", "value": '{"name": "generate_password", "arguments": {"length": 12}}'},
        {"from": "observation", "value": '{"password": "aB3$fG7&kL9!"}'},
        {"from": "gpt", "value": "Here is your new password: aB3$fG7&kL9!."},
    ],
    "tools": json.dumps(
        [
            {
                "name": "generate_password",
                "description": "Generate a random password",
                "parameters": {
                    "type": "object",
                    "properties": {"length": {"type": "integer", "description": "The length of the password"}},
                    "required": ["length"],
                },
            }
        ]
    ),
}
# LLaMA-Factory data/README.md: Alpaca (supervised fine-tuning), with system and history.
ALPACA_DOC = {
    "instruction": "human instruction (required)",
    "input": "human input (optional)",
    "output": "model response (required)",
    "system": "system prompt (optional)",
    "history": [
        ["human instruction in the first round (optional)", "model response in the first round (optional)"],
        ["human instruction in the second round (optional)", "model response in the second round (optional)"],
    ],
}
# Stanford Alpaca's alpaca_data.json: an empty input.
ALPACA_STANFORD = {
    "instruction": "Give three tips for staying healthy.",
    "input": "",
    "output": "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Get enough sleep.",
}
# OpenAI legacy completions fine-tuning.
PROMPT_COMPLETION = {"prompt": "What is 2+2?", "completion": "4"}


def jsonl(*objects: dict) -> bytes:
    return "".join(json.dumps(obj) + "\n" for obj in objects).encode()


def roles(conversation) -> list[tuple]:
    return [(m.role, m.content, m.weight) for m in conversation.messages]


def test_openai_chat_with_weights():
    parsed = parse_bytes(jsonl(OPENAI_MARV))
    assert parsed.ok and parsed.format == "chat"
    assert [m.weight for m in parsed.conversations[0].messages] == [1.0, 1.0, 0.0, 1.0, 1.0]


def test_openai_tool_calling_example():
    parsed = parse_bytes(jsonl(OPENAI_TOOLS))
    assert parsed.ok, parsed.errors
    (conversation,) = parsed.conversations
    (call,) = conversation.messages[1].tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == (
        "call_id",
        "get_current_weather",
        {"location": "San Francisco, USA", "format": "celsius"},
    )
    assert conversation.messages[1].content == ""
    assert conversation.tools == ({"type": "function", "function": WEATHER_SCHEMA},)


def test_legacy_functions_read_as_tools():
    parsed = parse_bytes(jsonl(OPENAI_FUNCTIONS))
    assert parsed.ok, parsed.errors
    (conversation,) = parsed.conversations
    modern = parse_bytes(jsonl(OPENAI_TOOLS)).conversations[0]
    assert conversation.tools == modern.tools
    assert conversation.messages[1].tool_calls[0].name == "get_current_weather"
    assert conversation.messages[1].tool_calls[0].id == "call_1"  # filled in


def test_full_schema_developer_name_parts_results_parallel():
    line = {
        "messages": [
            {"role": "developer", "content": "Answer tersely."},
            {"role": "user", "name": "ana", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris and Rome?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "get_current_weather", "arguments": '{"location": "Paris"}'}},
                    {"id": "b", "type": "function", "function": {"name": "get_current_weather", "arguments": '{"location": "Rome"}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "b", "content": "rain"},
            {"role": "tool", "tool_call_id": "a", "content": "sun"},
            {"role": "assistant", "content": "Paris: sun. Rome: rain.", "weight": 0.5},
        ],
        "tools": [{"type": "function", "function": WEATHER_SCHEMA}],
        "parallel_tool_calls": True,
    }  # fmt: skip
    parsed = parse_bytes(jsonl(line))
    assert parsed.ok, parsed.errors
    (conversation,) = parsed.conversations
    assert conversation.messages[0].role == "developer"
    assert conversation.messages[1].content == "Weather in Paris and Rome?" and conversation.messages[1].name == "ana"
    assert [m.tool_call_id for m in conversation.messages[3:5]] == ["b", "a"]
    assert conversation.parallel_tool_calls is True


def test_sharegpt_documented_example():
    parsed = parse_bytes(jsonl(SHAREGPT_DOC))
    assert parsed.ok and parsed.format == "sharegpt"
    assert roles(parsed.conversations[0]) == [
        ("system", "system prompt (optional)", 1.0),
        ("user", "human instruction", 1.0),
        ("assistant", "model response", 1.0),
        ("user", "human instruction", 1.0),
        ("assistant", "model response", 1.0),
    ]


def test_sharegpt_function_call_and_observation():
    parsed = parse_bytes(jsonl(SHAREGPT_TOOLS))
    assert parsed.ok, parsed.errors
    (conversation,) = parsed.conversations
    call_turn, result, reply = conversation.messages[1:]
    (call,) = call_turn.tool_calls
    assert (call_turn.role, call.name, json.loads(call.arguments)) == ("assistant", "generate_password", {"length": 12})
    assert (result.role, result.tool_call_id) == ("tool", call.id)
    assert reply.role == "assistant"
    assert conversation.tools[0]["function"]["name"] == "generate_password"


def test_alpaca_documented_example_with_system_and_history():
    parsed = parse_bytes(jsonl(ALPACA_DOC))
    assert parsed.ok and parsed.format == "alpaca"
    assert roles(parsed.conversations[0]) == [
        ("system", "system prompt (optional)", 1.0),
        ("user", "human instruction in the first round (optional)", 1.0),
        ("assistant", "model response in the first round (optional)", 1.0),
        ("user", "human instruction in the second round (optional)", 1.0),
        ("assistant", "model response in the second round (optional)", 1.0),
        ("user", "human instruction (required)\nhuman input (optional)", 1.0),
        ("assistant", "model response (required)", 1.0),
    ]


def test_alpaca_empty_input_is_just_the_instruction():
    parsed = parse_bytes(jsonl(ALPACA_STANFORD))
    assert parsed.ok
    assert roles(parsed.conversations[0])[0] == ("user", "Give three tips for staying healthy.", 1.0)


def test_prompt_completion_still_reads():
    parsed = parse_bytes(jsonl(PROMPT_COMPLETION))
    assert parsed.ok and parsed.format == "prompt_completion"


# ----------------------------------------------------------------------------- detection and --format


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (OPENAI_MARV, "chat"),
        (SHAREGPT_DOC, "sharegpt"),
        (ALPACA_DOC, "alpaca"),
        (PROMPT_COMPLETION, "prompt_completion"),
    ],
)
def test_format_is_reported(line, name, tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(line))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert [row for row in out.splitlines() if row.startswith("format")] == [f"format: {name} (detected)"]
    assert main(["validate", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["format"] == name


def test_detection_skips_lines_in_no_format():
    parsed = parse_bytes(b"not json\n" + jsonl(SHAREGPT_DOC))
    assert parsed.format == "sharegpt"
    assert [(p.code, p.line) for p in parsed.errors] == [("not_json", 1)]


def test_mixing_formats_names_the_first_line_of_the_second_format():
    parsed = parse_bytes(jsonl(OPENAI_MARV, OPENAI_MARV, SHAREGPT_DOC, ALPACA_DOC, SHAREGPT_DOC))
    assert [(p.code, p.line) for p in parsed.errors] == [
        ("mixed_formats", 3),
        ("mixed_formats", 4),
        ("mixed_formats", 5),
    ]
    first = parsed.errors[0].message
    assert first.startswith("line 3 is ShareGPT") and "OpenAI chat" in first and "from line 1" in first


def test_format_flag_forces_one_format(tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    path.write_bytes(jsonl(SHAREGPT_DOC, OPENAI_MARV))
    assert [p.code for p in read_file(path).errors] == ["mixed_formats"]
    forced = read_file(path, format="chat")
    assert forced.format == "chat"
    assert [(p.code, p.line) for p in forced.errors] == [
        ("unknown_key", 1),  # conversations
        ("unknown_key", 1),  # system
        ("bad_tools", 1),  # "tools": "" is not a list
        ("missing_messages", 1),
    ]
    assert main(["validate", str(path), "--format", "sharegpt"]) == 1
    assert "format: sharegpt (--format)" in capsys.readouterr().out
    assert main(["validate", str(path), "--format", "sharegpt", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["stats"]["format"] == "sharegpt" and {e["line"] for e in report["errors"]} == {2}


def test_unknown_format_is_refused():
    with pytest.raises(UserError, match="--format"):
        parse_bytes(jsonl(OPENAI_MARV), format="csv")


# ----------------------------------------------------------------------------- .jsonl.gz and Parquet


def test_gzipped_jsonl(tmp_path):
    path = tmp_path / "train.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl(OPENAI_MARV, SHAREGPT_DOC)))
    parsed = read_file(path)
    assert parsed.format == "chat" and [(p.code, p.line) for p in parsed.errors] == [("mixed_formats", 2)]


@pytest.mark.parametrize("block", [3, 7, 16])  # blocks are smaller than the limit, as READ_BLOCK is
def test_gzip_stops_at_the_first_line_over_the_limit_whatever_the_blocks(monkeypatch, block):
    import io

    from finetune.data import read

    monkeypatch.setattr(read, "READ_BLOCK", block)
    data = b"ab\ncdef\n" + b"x" * 40 + b"\nnever read\n"
    got = bytearray()
    with pytest.raises(read.LineTooLong) as raised:
        for part in read.gunzip_bounded(io.BytesIO(gzip.compress(data)), max_line_bytes=30):
            got += part
    assert raised.value.line == 3 and raised.value.start == 8
    assert bytes(got[: raised.value.start]) == b"ab\ncdef\n"  # the lines before it are whole
    whole = list(read.gunzip_bounded(io.BytesIO(gzip.compress(data)), max_line_bytes=40))
    assert b"".join(whole) == data  # a line at the limit passes


def test_a_gzip_line_over_the_limit_keeps_the_lines_before_it(tmp_path, monkeypatch):
    from finetune.data import read

    monkeypatch.setattr(read, "MAX_LINE_BYTES", len(jsonl(OPENAI_MARV)))
    monkeypatch.setattr(read, "READ_BLOCK", 64)
    path = tmp_path / "train.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl(OPENAI_MARV) + b'{"messages": "' + b"x" * 5000 + b'"}\n'))
    parsed = read_file(path)
    assert [(p.code, p.line) for p in parsed.errors] == [("line_too_long", 2)]
    assert "reading stopped there" in parsed.errors[0].message and len(parsed.conversations) == 1
    first_line_only = tmp_path / "one.jsonl.gz"
    first_line_only.write_bytes(gzip.compress(b"y" * 5000))
    assert [(p.code, p.line) for p in read_file(first_line_only).errors] == [("line_too_long", 1)]


def test_broken_gzip_is_a_user_error(tmp_path):
    path = tmp_path / "train.jsonl.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(UserError, match="gzip"):
        read_file(path)


def test_parquet_rows_are_lines(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [OPENAI_TOOLS, OPENAI_MARV, {"messages": [{"role": "user", "content": "hi"}]}]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    parsed = read_file(path)
    assert parsed.format == "chat"
    assert [(p.code, p.line) for p in parsed.errors] == [("no_target", 3)]
    assert [c.line for c in parsed.conversations] == [1, 2]
    # a null in a column (the schema is shared by every row) is an absent key, not a null value
    assert parsed.conversations[1].messages[2].weight == 0.0 and parsed.conversations[1].tools == ()
    assert parsed.conversations[0].messages[1].tool_calls[0].name == "get_current_weather"


def test_parquet_alpaca_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "alpaca.parquet"
    pq.write_table(pa.Table.from_pylist([ALPACA_STANFORD, ALPACA_DOC]), path)
    parsed = read_file(path)
    assert parsed.ok and parsed.format == "alpaca" and len(parsed.conversations) == 2


def test_damaged_parquet_is_a_user_error(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match="Parquet"):
        read_file(path)


# ----------------------------------------------------------------------------- finetune convert


@pytest.mark.parametrize("source", [SHAREGPT_TOOLS, ALPACA_DOC, OPENAI_FUNCTIONS, PROMPT_COMPLETION, OPENAI_TOOLS])
def test_convert_writes_openai_chat_that_reads_back_the_same(source, tmp_path, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(jsonl(source, source))
    assert main(["convert", str(src), "--out", str(out)]) == 0
    assert f"format: {read_file(src).format}" in capsys.readouterr().out
    converted = read_file(out)
    assert converted.format == "chat" and converted.errors == []
    original = read_file(src)
    assert [c.key() for c in converted.conversations] == [c.key() for c in original.conversations]
    for line in out.read_text().splitlines():
        obj = json.loads(line)
        for message in obj["messages"]:
            for call in message.get("tool_calls", []):
                assert isinstance(call["function"]["arguments"], str) and call["id"] and call["type"] == "function"


def test_convert_takes_format_auto_like_the_other_commands(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl(ALPACA_DOC, ALPACA_DOC))
    assert main(["convert", str(src), "--out", str(tmp_path / "auto.jsonl"), "--format", "auto"]) == 0
    assert main(["convert", str(src), "--out", str(tmp_path / "forced.jsonl"), "--format", "alpaca"]) == 0
    assert (tmp_path / "auto.jsonl").read_bytes() == (tmp_path / "forced.jsonl").read_bytes()


def test_convert_never_overwrites_and_refuses_invalid_files(tmp_path, capsys):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(jsonl(ALPACA_DOC))
    out.write_text("mine\n")
    assert main(["convert", str(src), "--out", str(out)]) == 1
    assert "already exists" in capsys.readouterr().err and out.read_text() == "mine\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl(ALPACA_DOC) + b"{oops\n")
    target = tmp_path / "new.jsonl"
    assert main(["convert", str(bad), "--out", str(target)]) == 1
    assert f"{bad}:2 [not_json]" in capsys.readouterr().err and not target.exists()


def test_convert_keeps_weights_and_parallel_flag(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(jsonl(OPENAI_MARV | {"tools": OPENAI_TOOLS["tools"], "parallel_tool_calls": False}))
    assert main(["convert", str(src), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert [m.get("weight") for m in written["messages"]] == [None, None, 0, None, None]
    assert written["parallel_tool_calls"] is False and written["tools"] == OPENAI_TOOLS["tools"]
    assert Path(out).read_text().count("\n") == 1


# ----------------------------------------------------------------------------- detection from the first valid line


def test_a_broken_first_line_does_not_decide_the_format():
    damaged_alpaca = {"output": 3}  # a known format's key, but not a valid line
    parsed = parse_bytes(jsonl(damaged_alpaca, SHAREGPT_TOOLS, SHAREGPT_DOC))
    assert parsed.format == "sharegpt" and len(parsed.conversations) == 2
    assert [(p.code, p.line) for p in parsed.errors] == [("mixed_formats", 1)]
    assert "from line 2" in parsed.errors[0].message


def test_with_no_valid_line_the_first_line_in_a_known_format_decides():
    parsed = parse_bytes(jsonl({"output": 3}, {"messages": []}))
    assert parsed.format == "alpaca"
    assert [(p.code, p.line) for p in parsed.errors] == [
        ("missing_content", 1),
        ("content_not_string", 1),
        ("mixed_formats", 2),
    ]


# ----------------------------------------------------------------------------- a .json file holding one array


def test_a_json_array_file_is_read_item_by_item(tmp_path, capsys):
    path = tmp_path / "alpaca_en_demo.json"
    path.write_text(json.dumps([ALPACA_STANFORD, ALPACA_DOC, {"instruction": "q"}], indent=2))
    parsed = read_file(path)
    assert parsed.format == "alpaca" and len(parsed.conversations) == 2
    assert [(p.code, p.line) for p in parsed.errors] == [("missing_content", 3)]  # item 3 has no output
    out = tmp_path / "out.jsonl"
    path.write_text(json.dumps([ALPACA_STANFORD, ALPACA_DOC], indent=4))
    assert main(["convert", str(path), "--out", str(out)]) == 0
    assert [c.key() for c in read_file(out).conversations] == [c.key() for c in read_file(path).conversations]


def test_json_array_items_keep_every_check():
    from finetune.data.read import json_array_as_jsonl

    items = b'[\n  {"prompt": "a", "prompt": "b", "completion": "c"},\n  {"prompt": "x\\ny", "completion": "z"}\n]\n'
    parsed = parse_bytes(json_array_as_jsonl(items))
    assert [(p.code, p.line) for p in parsed.errors] == [("duplicate_key", 1)]
    assert parsed.conversations[0].messages[0].content == "x\ny"  # an escaped newline stays in the text


@pytest.mark.parametrize(
    ("data", "codes"),
    [
        (b"[]\n", [("empty_file", None)]),
        (b'[{"prompt": "a", "completion": "b"},]\n', [("not_json", 1)]),  # damaged: read as JSON Lines
        (b'[\n{"prompt": "a", "completion": "b"}\n', [("not_json", 1)]),  # never closed
        (b'[{"prompt": "a", "completion": "b"}]\n[1]\n', [("not_object", 1), ("not_object", 2)]),  # two arrays
        (b'[{"prompt": "a", "completion": "b"}, 1]\n', [("not_object", 1)]),  # not only examples: JSON Lines
    ],
)
def test_empty_and_damaged_arrays(data, codes, tmp_path):
    path = tmp_path / "data.json"
    path.write_bytes(data)
    assert [(p.code, p.line) for p in read_file(path).errors] == codes


def test_a_file_in_no_known_format_is_told_which_formats_are_read():
    parsed = parse_bytes(jsonl({"text": "document"}))  # LLaMA-Factory's pre-training format
    assert parsed.format is None
    (error,) = parsed.errors
    assert (error.code, error.line) == ("missing_messages", 1)
    for name in ('"text"', '"messages"', '"conversations"', '"instruction"', '"prompt"'):
        assert name in error.message


def test_sharegpt_problems_are_told_in_its_own_turns_and_roles():
    system_key = {
        "conversations": [
            {"from": "human", "value": "a"},
            {"from": "human", "value": "b"},
            {"from": "gpt", "value": "c"},
        ],
        "system": "s",  # a system prompt given as its own key is no turn: turn 2 is still turn 2
    }
    (error,) = parse_bytes(jsonl(system_key)).errors
    assert error.code == "bad_role_order" and error.message.startswith("turn 2 is human after a human turn")
    assert "expected gpt" in error.message
    calls_then_gpt = {"conversations": SHAREGPT_TOOLS["conversations"][:2] + SHAREGPT_TOOLS["conversations"][3:]}
    (error,) = parse_bytes(jsonl(calls_then_gpt)).errors
    assert error.message.startswith("turn 3 is gpt after a function_call turn; expected observation")


def test_convert_leaves_a_users_partial_file_alone(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(jsonl(PROMPT_COMPLETION))
    mine = tmp_path / "out.jsonl.partial"
    mine.write_text("mine\n")
    assert main(["convert", str(src), "--out", str(out)]) == 0
    assert mine.read_text() == "mine\n" and read_file(out).ok
    assert out.stat().st_mode & 0o777 == src.stat().st_mode & 0o777  # an ordinary new file, not a private one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl", "out.jsonl.partial"]


def test_the_codes_table_is_exactly_the_codes_of_the_code():
    import re

    from finetune.data import fitting, invented, validate
    from finetune.data.formats import lines

    doc = (Path(__file__).parents[3] / "docs" / "formats.md").read_text(encoding="utf-8")
    table = doc.split("\n## Codes\n", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z_0-9]+)` \| (?:error|warning) \|", table, flags=re.M)
    constants = {
        value
        for module in (lines, validate, fitting, invented)
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"[a-z][a-z_0-9]+", value)
    }
    assert len(documented) == len(set(documented))  # each code once
    assert set(documented) == constants, (set(documented) - constants, constants - set(documented))
