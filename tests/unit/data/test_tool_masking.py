"""Tool calls are scored with their assistant turn; tool results and schemas are context. Checked token by token."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from finetune.commands.cli import main
from finetune.data.prepare import prepare_conversations
from finetune.data.read import parse_bytes
from finetune.data.records import build_records
from finetune.data.tokenize import ChatTokenizer
from finetune.data.types import IGNORE_INDEX
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
LINE = {
    "messages": [
        {"role": "system", "content": "You are the travel desk."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny, 21 C"},
        {"role": "tool", "tool_call_id": "b", "content": "rain, 14 C"},
        {"role": "assistant", "content": "Paris is sunny; Rome has rain."},
    ],
    "tools": [WEATHER],
}
CALL_TURN = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>'
)
FINAL_TURN = "Paris is sunny; Rome has rain.<|im_end|>"

# Plain ChatML, as the toy model had before tools: it drops tool calls and schemas on the floor.
PLAIN_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
)
# Calls written instead of the content, as bare JSON (Llama 3.1 style), with an empty think block before every
# assistant turn (Qwen3 style): the scored span must start after the think block, at the JSON.
BARE_JSON_THINK = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' }}"
    "{% if message['tool_calls'] %}{% for call in message['tool_calls'] %}"
    "{{ '{\"name\": \"' + call['function']['name'] + '\", \"parameters\": ' + (call['function']['arguments'] | tojson) + '}' }}"
    "{% endfor %}{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\n' }}"
    "{% elif message['role'] == 'tool' %}{{ '<|im_start|>ipython\n' + message['content'] + '<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
)


@pytest.fixture(scope="module")
def tokenizer(toy_model):
    return AutoTokenizer.from_pretrained(toy_model)


def conversation(line: dict = LINE):
    parsed = parse_bytes((json.dumps(line) + "\n").encode(), "tools.jsonl")
    assert parsed.ok, parsed.errors
    return parsed.conversations[0]


def tokenized(tokenizer, line: dict = LINE, policy: str = "all"):
    chat = ChatTokenizer(tokenizer)
    return [chat.tokenize(r, 4096, "left").record for r in build_records(conversation(line), 0, policy)]


def scored_text(tokenizer, record) -> str:
    return tokenizer.decode([t for t, label in zip(record.input_ids, record.labels, strict=True) if label != -100])


def test_every_token_is_scored_exactly_when_it_belongs_to_an_assistant_turn(tokenizer):
    (record,) = tokenized(tokenizer)
    text = ChatTokenizer(tokenizer).render(conversation().messages, conversation().tools)
    spans = []
    for turn in (CALL_TURN, FINAL_TURN):
        start = text.index(turn)
        spans.append((start, start + len(turn)))
    position = 0
    for token, label in zip(record.input_ids, record.labels, strict=True):
        piece = tokenizer.decode([token])
        assert text.startswith(piece, position), (position, piece)
        inside = any(start <= position and position + len(piece) <= end for start, end in spans)
        assert (label != IGNORE_INDEX) == inside, f"token {piece!r} at {position}: scored={label != IGNORE_INDEX}"
        if label != IGNORE_INDEX:
            assert label == token
        position += len(piece)
    assert position == spans[-1][1]  # the record ends with the last scored token
    assert scored_text(tokenizer, record) == CALL_TURN + FINAL_TURN


def test_schemas_and_tool_results_are_context(tokenizer):
    (record,) = tokenized(tokenizer)
    context = tokenizer.decode([t for t, label in zip(record.input_ids, record.labels, strict=True) if label == -100])
    assert '"description": "The weather in a city now"' in context  # the schema, in the system turn
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in context
    assert "rain, 14 C" in context and "rain, 14 C" not in scored_text(tokenizer, record)


def test_weight_zero_call_turn_is_context_and_each_policy_ends_at_the_call(tokenizer):
    line = json.loads(json.dumps(LINE))
    line["messages"][2]["weight"] = 0
    (record,) = tokenized(tokenizer, line)
    assert scored_text(tokenizer, record) == FINAL_TURN
    first, second = tokenized(tokenizer, policy="each")
    assert scored_text(tokenizer, first) == CALL_TURN
    assert tokenizer.decode(first.input_ids).endswith("</tool_call><|im_end|>")
    assert scored_text(tokenizer, second) == FINAL_TURN


def test_a_call_without_content_is_scored_from_the_call_block(tokenizer):
    line = json.loads(json.dumps(LINE))
    line["messages"][2]["content"] = None
    (record,) = tokenized(tokenizer, line)
    assert scored_text(tokenizer, record) == CALL_TURN.removeprefix("Let me check.\n") + FINAL_TURN


def test_another_template_bare_json_calls_after_a_think_block(toy_model):
    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    tokenizer.chat_template = BARE_JSON_THINK  # it renders no schemas, so the line goes without them
    (record,) = tokenized(tokenizer, LINE | {"tools": []})
    calls = '{"name": "get_weather", "parameters": {"city": "Paris"}}{"name": "get_weather", "parameters": {"city": "Rome"}}'
    assert scored_text(tokenizer, record) == calls + "<|im_end|>" + FINAL_TURN
    assert "<think>" not in scored_text(tokenizer, record)


def test_validate_show_marks_the_call_scored_and_the_result_masked(toy_model, tmp_path, capsys):
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps(LINE) + "\n")
    assert main(["validate", str(path), "--model", str(toy_model), "--show", "1", "--json"]) == 0
    (shown,) = json.loads(capsys.readouterr().out)["shown"]
    assert f"[[{CALL_TURN}]]" in shown["text"] and f"[[{FINAL_TURN}]]" in shown["text"]
    assert "<tool_response>\nrain, 14 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n[[" in shown["text"]
    assert "[[" not in shown["text"].split("<tool_response>")[1]  # the results are outside every scored span
    assert main(["validate", str(path), "--model", str(toy_model), "--show", "1"]) == 0
    assert "[[Let me check." in capsys.readouterr().out


def test_template_cannot_render_tools_fires_once_and_is_silent_with_a_tool_template(toy_model, tmp_path, capsys):
    plain = tmp_path / "plain-model"
    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    tokenizer.chat_template = PLAIN_CHATML
    tokenizer.save_pretrained(plain)
    path = tmp_path / "tools.jsonl"
    no_tools = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    path.write_text("\n".join(json.dumps(x) for x in (no_tools, LINE, LINE | {"tools": []})) + "\n")
    assert main(["validate", str(path), "--model", str(plain), "--json"]) == 1
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert [(e["code"], e["line"]) for e in errors] == [("template_cannot_render_tools", 2)]
    assert "2 lines" in errors[0]["message"] and "tool calls" in errors[0]["message"]
    assert main(["validate", str(path), "--model", str(toy_model), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["errors"] == []
    with pytest.raises(UserError, match=r"line 1 \[template_cannot_render_tools\]: .* cannot render tool calls"):
        prepare_conversations([conversation()], [], RunConfig(val_fraction=0), tokenizer)


@pytest.mark.parametrize("exact", [True, False])
def test_plan_counts_tool_schemas_as_context_not_targets(tokenizer, exact):
    with_tools = conversation()
    without = conversation(LINE | {"tools": []})
    config = RunConfig(val_fraction=0)
    a = prepare_conversations([with_tools], [], config, tokenizer if exact else None).summary
    b = prepare_conversations([without], [], config, tokenizer if exact else None).summary
    assert a.target_tokens == b.target_tokens > 0
    assert a.context_tokens > b.context_tokens
    assert a.tokens_in_file - b.tokens_in_file == a.context_tokens - b.context_tokens  # billed, not scored
    if exact:
        schema_block = len(tokenizer(json.dumps(WEATHER))["input_ids"])
        assert a.context_tokens - b.context_tokens > schema_block


def test_the_plan_shows_schema_tokens_as_context(toy_model, tmp_path, capsys):
    with_tools, without = tmp_path / "with.jsonl", tmp_path / "without.jsonl"
    with_tools.write_text(json.dumps(LINE) + "\n")
    without.write_text(json.dumps(LINE | {"tools": []}) + "\n")
    plans = []
    for path in (with_tools, without):
        assert main(["plan", str(path), "--model", str(toy_model), "--val-fraction", "0", "--json"]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    a, b = plans
    assert a["target_tokens"] == b["target_tokens"] > 0
    assert a["context_tokens"] - b["context_tokens"] == a["tokens_in_file"] - b["tokens_in_file"] > 0
    assert a["target_tokens"] + a["context_tokens"] == a["tokens_in_file"]
    assert main(["plan", str(with_tools), "--model", str(toy_model), "--val-fraction", "0"]) == 0
    assert f"{a['context_tokens']:,} context (prompts, tool schemas" in capsys.readouterr().out


def test_a_template_that_refuses_a_conversation_is_a_line_error_not_a_traceback(toy_model, tmp_path, capsys):
    strict = tmp_path / "strict-model"
    tokenizer = AutoTokenizer.from_pretrained(toy_model)
    single_calls_only = "{% for m in messages %}{% if m['tool_calls'] and m['tool_calls'] | length > 1 %}"
    single_calls_only += (
        "{{ raise_exception('This model only supports single tool-calls at once!') }}{% endif %}{% endfor %}"
    )
    tokenizer.chat_template = single_calls_only + tokenizer.chat_template
    tokenizer.save_pretrained(strict)
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps(LINE) + "\n")
    assert main(["validate", str(path), "--model", str(strict), "--json"]) == 1
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error["code"] == "template_mismatch" and "single tool-calls" in error["message"] and error["line"] == 1
