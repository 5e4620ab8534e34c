"""A tool-calling data set trains end to end on the toy model; --skip-invalid trains on the valid lines only."""

from __future__ import annotations

import json

import pytest

from finetune.commands.cli import main

CITIES = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Perth", "Dakar", "Hanoi", "Porto", "Seoul"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def tool_line(i: int, city: str) -> dict:
    call = {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }
    return {
        "messages": [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"{city}: sunny, {10 + i} C"},
            {"role": "assistant", "content": f"It is sunny in {city}, {10 + i} degrees."},
        ],
        "tools": [WEATHER],
    }  # fmt: skip


def sharegpt_line(i: int, city: str) -> dict:
    return {
        "conversations": [
            {"from": "human", "value": f"Weather in {city}?"},
            {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": city}})},
            {"from": "observation", "value": f"{city}: rain"},
            {"from": "gpt", "value": f"It rains in {city}."},
        ],
        "tools": json.dumps([WEATHER["function"]]),
    }


SMALL = ["--epochs", "1", "--batch-size", "4", "--val-fraction", "0", "--max-seq-len", "1024"]


@pytest.fixture(scope="module")
def data_with_one_bad_line(tmp_path_factory):
    lines = [json.dumps(tool_line(i, city)) for i, city in enumerate(CITIES)]
    bad = tool_line(99, "Nowhere")
    bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{city: Nowhere}"
    lines.insert(5, json.dumps(bad))
    path = tmp_path_factory.mktemp("tools") / "tools.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_invalid_file_stops_before_training(data_with_one_bad_line, toy_model, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(data_with_one_bad_line), "--model", str(toy_model), "--out", str(out), *SMALL]) == 1
    err = capsys.readouterr().err
    assert f"{data_with_one_bad_line}:6 [arguments_not_json]" in err and "--skip-invalid" in err
    assert not (out / "plan.json").exists() and not (out / "metrics.jsonl").exists()


def test_skip_invalid_trains_on_the_valid_tool_calls(data_with_one_bad_line, toy_model, tmp_path):
    out = tmp_path / "run"
    args = ["train", str(data_with_one_bad_line), "--model", str(toy_model), "--out", str(out), *SMALL]
    assert main([*args, "--skip-invalid"]) == 0
    (skipped,) = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert skipped["line"] == 6 and skipped["codes"] == ["arguments_not_json"]
    assert json.loads(skipped["text"])["messages"][0]["content"] == "What is the weather in Nowhere?"
    plan = json.loads((out / "plan.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert plan["skipped_lines"] == 1 and report["skipped_lines"] == 1
    assert "skipped_lines" in [w["code"] for w in plan["warnings"]]
    assert plan["examples"] == len(CITIES) and plan["total_steps"] == 3 == report["steps_taken"]
    assert report["tokens_match"] is True
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(row["target_tokens"] > 0 for row in rows)


def test_sharegpt_tool_data_trains_with_format_forced(toy_model, tmp_path):
    path = tmp_path / "sharegpt.jsonl"
    path.write_text("\n".join(json.dumps(sharegpt_line(i, c)) for i, c in enumerate(CITIES[:8])) + "\n")
    out = tmp_path / "run"
    args = ["train", str(path), "--model", str(toy_model), "--out", str(out), "--format", "sharegpt", *SMALL]
    assert main(args) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["examples"] == 8 and plan["skipped_lines"] == 0 and not (out / "skipped.jsonl").exists()


def test_a_llama_factory_json_array_trains_and_skips_its_bad_item(toy_model, tmp_path):
    """LLaMA-Factory ships its data as one pretty-printed JSON array: item N is "line" N everywhere."""
    items = [sharegpt_line(i, c) for i, c in enumerate(CITIES[:8])]
    items.insert(2, {"conversations": [{"from": "human", "value": "hi"}, {"from": "human", "value": "again"}]})
    path = tmp_path / "glaive_toolcall_demo.json"
    path.write_text(json.dumps(items, indent=2))
    out = tmp_path / "run"
    assert main(["train", str(path), "--model", str(toy_model), "--out", str(out), "--skip-invalid", *SMALL]) == 0
    (skipped,) = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert (skipped["line"], skipped["codes"]) == (3, ["no_target"])  # "no gpt turn"
    assert skipped["problems"][0]["message"].startswith("no gpt turn")
    assert json.loads(skipped["text"]) == items[2]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["examples"] == 8 and plan["skipped_lines"] == 1
