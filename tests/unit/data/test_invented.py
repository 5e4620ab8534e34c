"""Replies that state specifics the conversation never gave, warned before training (docs/answers.md): `finetune
validate` and `finetune plan` count them by kind and name the lines, and never print a value; a reply that takes its
values from the conversation (the user's message, a tool result, the system message) or a placeholder is clean."""

from __future__ import annotations

import json

from finetune.commands.cli import main
from finetune.data.invented import scan_replies, summarize
from finetune.data.read import read_file

INVENTED = ("BR-46304", "BR-22222", "$42.10", "1Z999AA10123456784", "July 30")  # never printed
ROWS = [
    ("Where is my parcel?", "Your order BR-46304 ships on July 30, tracking number 1Z999AA10123456784."),  # line 1
    ("Where is order BR-11111?", "Order BR-11111 left our warehouse."),  # line 2: grounded
    ("Refund please.", "I refunded $42.10 for order BR-22222."),  # line 3
    ("Refund please.", "I refunded {amount} for order {order_id}."),  # line 4: placeholders the application fills
]


def _write(path, rows, extra=()) -> str:
    lines = [{"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]} for u, a in rows]
    path.write_text("".join(json.dumps(line) + "\n" for line in [*lines, *extra]))
    return str(path)


def test_validate_warns_with_counts_and_lines_and_no_value(tmp_path, capsys):
    path = _write(tmp_path / "support.jsonl", ROWS)
    assert main(["validate", path]) == 0  # a warning: the file is usable
    printed = capsys.readouterr().out
    (warning,) = [line for line in printed.splitlines() if "[invented_specifics]" in line]
    assert warning.startswith(f"{path}:1 [invented_specifics] 2 of 4 trained replies state 5 specifics")
    assert "2 identifiers (order, ticket, account), 1 amount, 1 date, 1 tracking code" in warning
    assert "support.jsonl lines 1, 3" in warning and "a placeholder the application fills" in warning
    assert not any(value in printed for value in INVENTED)

    assert main(["validate", path, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    found = document["invented_specifics"]
    assert found["by_kind"] == {"identifier": 2, "amount": 1, "date": 1, "tracking": 1}
    assert found["files"] == {"support.jsonl": {"values": 5, "lines": [1, 3], "line_count": 2}}
    assert (found["total"], found["replies"], found["replies_read"]) == (5, 2, 4)
    assert not any(value in json.dumps(document) for value in INVENTED)


def test_values_given_by_a_tool_result_or_the_system_message_are_grounded(tmp_path, capsys):
    tool_call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    with_tool = {"messages": [
        {"role": "system", "content": "The customer's card ends in 4821."},
        {"role": "user", "content": "Where is my parcel?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"order": "BR-46304", "ships": "2024-07-30"}'},
        {"role": "assistant", "content": "Order BR-46304 ships on July 30 to the card ending in 4821."},
    ]}  # fmt: skip
    path = _write(tmp_path / "tools.jsonl", [], extra=[with_tool])
    assert main(["validate", path]) == 0
    assert "invented_specifics" not in capsys.readouterr().out


def test_a_reply_with_weight_0_is_not_learned_so_not_counted(tmp_path):
    context_only = {"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Order BR-1234 is late.", "weight": 0},
        {"role": "user", "content": "Thanks"}, {"role": "assistant", "content": "You're welcome."},
    ]}  # fmt: skip
    conversations = read_file(_write(tmp_path / "w.jsonl", [], extra=[context_only])).conversations
    assert scan_replies(conversations) == []
    assert summarize(scan_replies(conversations), "w.jsonl", 1)["files"] == {}


def test_plan_warns_before_training(tmp_path, capsys):
    path = _write(tmp_path / "support.jsonl", ROWS * 10)
    assert main(["plan", path, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    (warning,) = [w for w in plan["warnings"] if w["code"] == "invented_specifics"]
    assert warning["message"].startswith("20 of 40 trained replies state 50 specifics the conversation never gave")
    assert plan["invented_specifics"]["by_kind"]["identifier"] == 20
    assert not any(value in json.dumps(plan) for value in INVENTED)
