"""--show: scored tokens marked as [[ ]] (plain and coloured), token by token with --model, message by message without."""

from __future__ import annotations

import io
import json

from rich.console import Console

from finetune.commands.cli import main
from finetune.data.show import (
    ShownRecord,
    Span,
    marked_rich,
    marked_text,
    message_spans,
    print_records,
    token_spans,
)
from finetune.data.types import IGNORE_INDEX, Message, Record, TokenizedRecord


def test_marked_text_brackets_scored_spans_and_shows_fractional_weights() -> None:
    spans = [Span("ctx ", 0.0), Span("reply<eot>", 1.0), Span(" more ", 0.0), Span("half", 0.5)]
    assert marked_text(spans) == "ctx [[reply<eot>]] more [[half]]×0.5"


def test_token_spans_group_equal_weights() -> None:
    record = TokenizedRecord(
        input_ids=[1, 2, 3, 4, 5, 6],
        labels=[IGNORE_INDEX, IGNORE_INDEX, 3, 4, IGNORE_INDEX, 6],
        weights=[0.0, 0.0, 1.0, 1.0, 0.0, 0.25],
        conversation=0,
        line=1,
    )
    spans = token_spans(record, decode=lambda ids: "".join(f"<{i}>" for i in ids))
    assert spans == [Span("<1><2>", 0.0), Span("<3><4>", 1.0), Span("<5>", 0.0), Span("<6>", 0.25)]
    assert marked_text(spans) == "<1><2>[[<3><4>]]<5>[[<6>]]×0.25"


def test_message_spans_mark_only_targets() -> None:
    messages = (
        Message("user", "q"),
        Message("assistant", "a1", 0.0),
        Message("user", "q2"),
        Message("assistant", "a2"),
    )
    record = Record(messages, targets=(3,), conversation=0, line=1)
    assert marked_text(message_spans(record)) == "user: q\nassistant: a1\nuser: q2\nassistant: [[a2]]\n"


def test_empty_target_is_still_visible() -> None:
    record = Record((Message("user", "q"), Message("assistant", "")), targets=(1,), conversation=0, line=1)
    assert "assistant: [[]]" in marked_text(message_spans(record))


def test_rich_form_colours_targets_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="standard", width=100, highlight=False)
    shown = ShownRecord(
        line=3, number=1, target_tokens=2, total_tokens=5, spans=[Span("ctx ", 0), Span("ok", 1)], exact=True
    )
    print_records(console, [shown])
    text = out.getvalue()
    assert "\x1b[" in text  # coloured
    assert "[[ok]]" in text and "line 3" in text
    assert marked_rich([Span("a", 0), Span("b", 1)]).plain == "a[[b]]"


def test_show_without_model_prints_messages_plainly(write_file, chat, capsys) -> None:
    path = write_file(
        [chat(("user", "Where is it?"), ("assistant", "On its way.")), chat(("user", "x"), ("assistant", "y"))]
    )
    assert main(["validate", path, "--show", "1"]) == 0
    out = capsys.readouterr().out
    assert "user: Where is it?\nassistant: [[On its way.]]" in out
    assert "record 1 · line 1" in out and "record 2" not in out
    assert "\x1b[" not in out  # not a terminal: no colour codes, the brackets carry the marks


def test_show_with_model_marks_reply_and_end_of_turn(toy_model_dir, write_file, chat, capsys) -> None:
    conversation = chat(("user", "Where is my order?"), ("assistant", "It ships today."), system="Be brief.")
    path = write_file([conversation])
    assert main(["validate", path, "--model", toy_model_dir, "--show", "5"]) == 0
    out = capsys.readouterr().out
    assert "[[It ships today.<|im_end|>]]" in out
    record_text = out[out.index("record 1 · line 1") :]
    assert record_text.count("[[") == 1  # system, user and headers are context
    assert "Be brief.<|im_end|>" in out


def test_show_in_json(toy_model_dir, write_file, chat, capsys) -> None:
    conversation = chat(("user", "Hello there"), ("assistant", "Hi, how can I help?", 0.5))
    path = write_file([conversation])
    assert main(["validate", path, "--model", toy_model_dir, "--show", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (shown,) = report["shown"]
    assert shown["line"] == 1 and shown["tokens_exact"] is True
    assert shown["text"].endswith("[[Hi, how can I help?<|im_end|>]]×0.5")
    assert shown["target_tokens"] == report["stats"]["target_tokens"]
