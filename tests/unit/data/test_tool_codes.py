"""Every validation code added for tools, content parts and the open formats: one line that fires it, and a
close line that stays silent (no error at all)."""

from __future__ import annotations

import json

import pytest

from finetune.commands.cli import main
from finetune.data.read import parse_bytes

USER = {"role": "user", "content": "Weather in Paris?"}
REPLY = {"role": "assistant", "content": "Sunny, 21 C."}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def call(call_id: str = "c1", name: str = "get_weather", arguments: str = '{"city": "Paris"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calling(*calls: dict, content: str | None = None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def result(call_id: str | None = "c1", content: str = "sunny") -> dict:
    message = {"role": "tool", "content": content}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


def chat(*messages: dict, **top) -> dict:
    return {"messages": list(messages), **top}


# (case id, code, line that fires it, close line that must be silent)
CASES = [
    (
        "tool_without_call_after_plain_reply",
        "tool_without_call",
        chat(USER, {"role": "assistant", "content": "Let me look."}, result(), REPLY),
        chat(USER, calling(call()), result(), REPLY),
    ),
    (
        "tool_without_call_answered_twice",
        "tool_without_call",
        chat(USER, calling(call()), result(), result(), REPLY),
        chat(USER, calling(call(), call("c2")), result(), result("c2"), REPLY),
    ),
    (
        "tool_without_call_no_id_and_nothing_open",
        "tool_without_call",
        chat(USER, calling(call()), result(None), result(None), REPLY),
        chat(USER, calling(call(), call("c2")), result(None), result(None), REPLY),
    ),
    (
        "unknown_tool_call_id",
        "unknown_tool_call_id",
        chat(USER, calling(call()), result("c9"), REPLY),
        chat(USER, calling(call()), result("c1"), REPLY),
    ),
    (
        "duplicate_tool_call_id_same_turn",
        "duplicate_tool_call_id",
        chat(USER, calling(call(), call()), result(), REPLY),
        chat(USER, calling(call(), call("c2")), result(), REPLY),
    ),
    (
        "duplicate_tool_call_id_across_turns",
        "duplicate_tool_call_id",
        chat(USER, calling(call()), result(), calling(call()), result(), REPLY),
        chat(USER, calling(call()), result(), calling(call("c2")), result("c2"), REPLY),
    ),
    (
        "arguments_not_json",
        "arguments_not_json",
        chat(USER, calling(call(arguments="{city: Paris}")), result(), REPLY),
        chat(USER, calling(call(arguments='{"city": "Paris"}')), result(), REPLY),
    ),
    (
        "arguments_not_an_object",
        "arguments_not_json",
        chat(USER, calling(call(arguments='["Paris"]')), result(), REPLY),
        chat(USER, calling(call(arguments="{}")), result(), REPLY),
    ),
    (
        "arguments_sharegpt_function_call",
        "arguments_not_json",
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": "get_weather(Paris)"}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "function_call", "value": '{"name": "f"}'}]},
    ),
    (
        "unknown_function",
        "unknown_function",
        chat(USER, calling(call(name="get_wether")), result(), REPLY, tools=[WEATHER]),
        chat(USER, calling(call(name="get_weather")), result(), REPLY, tools=[WEATHER]),
    ),
    (
        "empty_assistant",
        "empty_assistant",
        chat(USER, {"role": "assistant", "content": None}),
        chat(USER, {"role": "assistant", "content": None, "tool_calls": [call()]}),
    ),
    (
        "empty_assistant_no_content_key",
        "empty_assistant",
        chat(USER, {"role": "assistant"}),
        chat(USER, {"role": "assistant", "tool_calls": [call()]}),
    ),
    (
        "non_text_content_image",
        "non_text_content",
        chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}, REPLY),
        chat({"role": "user", "content": [{"type": "text", "text": "a cat"}]}, REPLY),
    ),
    (
        "non_text_content_audio",
        "non_text_content",
        chat(
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}, REPLY
        ),
        chat({"role": "user", "content": [{"type": "text", "text": "hello"}]}, REPLY),
    ),
    (
        "bad_tools",
        "bad_tools",
        chat(USER, REPLY, tools=[{"type": "function", "function": {"description": "no name"}}]),
        chat(USER, REPLY, tools=[WEATHER]),
    ),
    (
        "bad_tools_parallel_flag",
        "bad_tools",
        chat(USER, REPLY, tools=[WEATHER], parallel_tool_calls="no"),
        chat(USER, REPLY, tools=[WEATHER], parallel_tool_calls=False),
    ),
    (
        "bad_tool_call_on_user",
        "bad_tool_call",
        chat(USER | {"tool_calls": [call()]}, REPLY),
        chat(USER, REPLY),
    ),
    (
        "bad_tool_call_shape",
        "bad_tool_call",
        chat(USER, calling({"id": "c1", "type": "function", "function": "get_weather"}), result(), REPLY),
        chat(USER, calling(call()), result(), REPLY),
    ),
    (
        "bad_history",
        "bad_history",
        {"instruction": "q", "output": "a", "history": [["only a question"]]},
        {"instruction": "q", "output": "a", "history": [["a question", "an answer"]]},
    ),
    (
        "bad_role_order_user_after_calls",
        "bad_role_order",
        chat(USER, calling(call()), USER, REPLY),
        chat(USER, calling(call()), result(), REPLY),
    ),
    (
        "bad_role_order_ends_with_tool_result",
        "bad_role_order",
        chat(USER, calling(call()), result()),
        chat(USER, calling(call())),
    ),
]


def line_codes(obj: dict) -> list[tuple[str, int]]:
    return [(p.code, p.line) for p in parse_bytes((json.dumps(obj) + "\n").encode(), "f.jsonl").errors]


@pytest.mark.parametrize(("code", "fired", "silent"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_code_fires_and_stays_silent(code, fired, silent):
    assert line_codes(fired) == [(code, 1)]
    assert line_codes(silent) == []


def test_unknown_function_is_only_checked_when_tools_are_given():
    assert line_codes(chat(USER, calling(call(name="anything")), result(), REPLY)) == []


def test_tool_results_without_ids_answer_the_open_calls_in_order():
    parsed = parse_bytes(
        (json.dumps(chat(USER, calling(call("x"), call("y")), result(None), result(None), REPLY)) + "\n").encode()
    )
    assert [m.tool_call_id for m in parsed.conversations[0].messages[2:4]] == ["x", "y"]


def test_messages_name_the_message_and_the_fix():
    (error,) = parse_bytes((json.dumps(chat(USER, calling(call()), result("c9"), REPLY)) + "\n").encode()).errors
    assert "message 3" in error.message and '"c9"' in error.message and "c1" in error.message
    (error,) = parse_bytes(
        (json.dumps(chat({"role": "user", "content": [{"type": "image_url"}]}, REPLY)) + "\n").encode()
    ).errors
    assert "text only" in error.message


def test_each_new_code_exits_1_in_the_cli(tmp_path, capsys):
    for case_id, code, fired, _ in CASES:
        path = tmp_path / f"{case_id}.jsonl"
        path.write_text(json.dumps(fired) + "\n")
        assert main(["validate", str(path), "--json"]) == 1
        assert [e["code"] for e in json.loads(capsys.readouterr().out)["errors"]] == [code]


def test_messages_read_as_english():
    (error,) = parse_bytes((json.dumps(chat(USER, result(), REPLY)) + "\n").encode()).errors
    assert "after a user message" in error.message
    (error,) = parse_bytes((json.dumps(chat(USER, calling(call(), call()), result(), REPLY)) + "\n").encode()).errors
    assert "earlier in the same message" in error.message
    (error,) = parse_bytes(
        (json.dumps(chat(USER, calling(call()), result(), calling(call()), result(), REPLY)) + "\n").encode()
    ).errors
    assert "already used in message 2" in error.message


# A message logged from the chat completions API carries these keys, empty.
LOGGED_REPLY = REPLY | {"refusal": None, "audio": None, "annotations": [], "function_call": None, "tool_calls": None}


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("refusal", "I can't help with that.", "unknown_key"),
        ("annotations", [{"type": "url_citation"}], "unknown_key"),
        ("audio", {"id": "audio_1", "data": "UklG"}, "non_text_content"),
    ],
)
def test_api_response_keys_are_accepted_empty_and_refused_full(key, value, code):
    assert line_codes(chat(USER, LOGGED_REPLY)) == []
    assert line_codes(chat(USER, LOGGED_REPLY | {key: value})) == [(code, 1)]
