"""Long conversations (issue 26): an over-long record is split by whole turns, every reply scored exactly once,
context the most recent turns that fit; a reply too long by itself drops only its own record."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from finetune.data.fitting import Fit, fit, fit_tokenized
from finetune.data.prepare import prepare_conversations
from finetune.data.records import build_records, fit_record
from finetune.data.tokenize import ChatTokenizer, load_tokenizer
from finetune.data.types import Conversation, Message, Record, ToolCall
from finetune.settings.config import RunConfig

PER_MESSAGE = 3  # the synthetic measure: a few template tokens per message, one token a character


def measure(record: Record) -> int:
    return sum(len(m.content) + PER_MESSAGE for m in record.messages)


@st.composite
def conversations(draw) -> Conversation:
    """A system message or not, then turns: a user message and a reply, some replies after a tool call."""
    messages = [Message("system", "s" * draw(st.integers(1, 30)))] if draw(st.booleans()) else []
    for turn in range(draw(st.integers(1, 9))):
        messages.append(Message("user", f"u{turn}:" + "x" * draw(st.integers(0, 60))))
        if draw(st.integers(0, 3)) == 0:  # a tool turn: the call is learned, the result is context
            call = ToolCall(f"call_{turn}", "lookup", "{}")
            messages.append(Message("assistant", f"c{turn}", tool_calls=(call,)))
            messages.append(Message("tool", f"r{turn}:" + "y" * draw(st.integers(0, 40)), tool_call_id=call.id))
        weight = draw(st.sampled_from([1.0, 1.0, 1.0, 0.0]))
        messages.append(Message("assistant", f"a{turn}:" + "z" * draw(st.integers(0, 80)), weight))
    if not any(m.role == "assistant" and m.weight > 0 for m in messages):
        messages[-1] = Message("assistant", messages[-1].content, 1.0)
    return Conversation(tuple(messages), line=7)


def _start(part: Record, original: Record) -> int:
    """Index in the original of the first message after the part's system message (contents are unique)."""
    head = 1 if part.messages[0].role == "system" else 0
    return original.messages.index(part.messages[head])


@settings(max_examples=300, deadline=None)
@given(conversations(), st.integers(20, 400))
def test_split_scores_every_reply_once_with_the_most_recent_turns_that_fit(conversation, limit):
    (record,) = build_records(conversation, 0, "all")
    parts = fit_record(record, limit, measure)
    scored = [part.messages[t] for part in parts for t in part.targets]
    assert scored == [record.messages[t] for t in record.targets]  # each reply once, in order
    system = record.messages[:1] if record.messages[0].role == "system" else ()
    turn_starts = [i for i, m in enumerate(record.messages) if m.role == "user"]
    for part in parts:
        start = _start(part, record)
        assert part.messages[: len(system)] == system  # the system message opens every part
        assert record.messages[start].role == "user"  # whole turns: never an orphan tool result first
        assert part.messages[len(system) :] == record.messages[start : start + len(part.messages) - len(system)]
        for message in part.messages:  # a tool result travels with its call
            if message.role == "tool":
                assert any(message.tool_call_id in {c.id for c in m.tool_calls} for m in part.messages)
        if measure(part) > limit:  # only one reply whose own turn is over the limit (the caller cuts or drops)
            first = part.targets[0] + start - len(system)
            assert len(part.targets) == 1 and start == max(s for s in turn_starts if s <= first)
            continue
        earlier = [s for s in turn_starts if s < start]
        if earlier:  # as much context as fits: one more turn would not
            wider = Record(system + record.messages[earlier[-1] : start + len(part.messages) - len(system)], (), 0, 7)
            assert measure(wider) > limit
    if measure(record) <= limit:  # (fit() keeps such a record as it is, without splitting it)
        assert len(parts) == 1


@settings(max_examples=200, deadline=None)
@given(conversations(), st.integers(20, 400), st.sampled_from(["last", "each"]))
def test_last_and_each_keep_their_one_reply_with_the_context_that_fits(conversation, limit, policy):
    for record in build_records(conversation, 0, policy):
        parts = fit(record, measure(record), limit, "left", measure)
        if measure(record) <= limit:
            assert parts == [(record, Fit.WHOLE)]
            continue
        ((part, kind),) = parts
        assert kind is Fit.SHORTENED and part.messages[part.targets[0]] == record.messages[record.targets[0]]
        assert part.messages[-1] == record.messages[-1]  # the record still ends with its reply


def test_truncation_drop_drops_the_over_long_record_whole():
    conversation = Conversation((Message("user", "q" * 50), Message("assistant", "a" * 50)), line=3)
    (record,) = build_records(conversation, 0, "all")
    assert fit(record, measure(record), 60, "drop", measure) is None
    assert fit(record, measure(record), 500, "drop", measure) == [(record, Fit.WHOLE)]


# ----------------------------------------------------------------------------- with the model's tokenizer


@pytest.fixture(scope="module")
def chat(toy_model) -> ChatTokenizer:
    return ChatTokenizer(load_tokenizer(str(toy_model)))


def _support_thread(turns: int, reply_words: int = 30, line: int = 1, long_turn: int | None = None) -> Conversation:
    messages = [Message("system", "You are the support team of Brightside. Be precise and kind.")]
    for turn in range(turns):
        messages.append(Message("user", f"Question {turn}: my router {turn} keeps dropping the line, why?"))
        words = 400 if turn == long_turn else reply_words
        messages.append(Message("assistant", f"Answer {turn}: " + " ".join(f"step{turn}-{i}" for i in range(words))))
    return Conversation(tuple(messages), line=line)


def _scored_ids(outcome) -> list[int]:
    return outcome.input_ids[outcome.weights > 0].tolist()


def test_exact_split_scores_every_target_token_exactly_once(chat):
    (record,) = build_records(_support_thread(8), 0, "all")
    whole = chat.tokenize_whole(record)
    limit = whole.total_tokens // 3
    kept, dropped = fit_tokenized(record, chat, limit, "left")
    assert not dropped and len(kept) >= 3 and all(kind is Fit.SPLIT for _, _, kind in kept)
    assert all(outcome.total_tokens <= limit and not outcome.cut_tokens for _, outcome, _ in kept)
    assert sum((_scored_ids(o) for _, o, _ in kept), []) == _scored_ids(whole)  # each target token once
    assert sum(int((o.weights > 0).sum()) for _, o, _ in kept) == int((whole.weights > 0).sum())
    for part, _, _ in kept[1:]:  # context: the most recent turns that fit; one more turn would not
        start = record.messages.index(part.messages[1])  # contents are unique
        assert record.messages[start].role == "user"
        end = start + len(part.messages) - 1
        earlier = max(i for i in range(start) if record.messages[i].role == "user")
        wider = record.messages[:1] + record.messages[earlier:end]
        targets = tuple(t + start - earlier for t in part.targets)
        assert chat.tokenize_whole(Record(wider, targets, 0, 1)).total_tokens > limit


def test_a_reply_too_long_by_itself_drops_only_its_record(chat):
    conversation = _support_thread(5, reply_words=20, line=4, long_turn=2)
    (record,) = build_records(conversation, 0, "all")
    kept, dropped = fit_tokenized(record, chat, 200, "left")
    assert len(dropped) == 1 and dropped[0][1].dropped == "target_would_be_cut"
    assert dropped[0][0].messages[-1].content.startswith("Answer 2:")
    scored = [part.messages[t].content.split(":")[0] for part, _, _ in kept for t in part.targets]
    assert scored == ["Answer 0", "Answer 1", "Answer 3", "Answer 4"]  # the other replies still train


def test_tool_results_stay_with_their_calls(chat):
    messages = [Message("system", "Use the tools.")]
    for turn in range(5):
        call = ToolCall(f"call_{turn}", "get_weather", '{"city": "Paris"}')
        messages += [
            Message("user", f"Weather {turn}? " + "please " * 20),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", f"result {turn}: sunny " + "and warm " * 20, tool_call_id=call.id),
            Message("assistant", f"It is sunny ({turn}). " + "Enjoy the day. " * 10),
        ]
    (record,) = build_records(Conversation(tuple(messages), line=1), 0, "all")
    whole = chat.tokenize_whole(record)
    kept, dropped = fit_tokenized(record, chat, whole.total_tokens // 3, "left")
    assert not dropped and len(kept) > 1
    for part, _, _ in kept:
        assert part.messages[1].role == "user"  # never starts with an orphan tool result
        calls = {c.id for m in part.messages for c in m.tool_calls}
        assert all(m.tool_call_id in calls for m in part.messages if m.role == "tool")
    assert sum((_scored_ids(o) for _, o, _ in kept), []) == _scored_ids(whole)


def test_prepared_data_counts_what_was_split_and_dropped(toy_model):
    tokenizer = load_tokenizer(str(toy_model))
    conversations = [
        _support_thread(1, line=1),
        _support_thread(8, line=2),
        _support_thread(5, reply_words=20, line=3, long_turn=2),
    ]
    config = RunConfig(data="support.jsonl", max_seq_len=200, val_fraction=0)
    summary = prepare_conversations(conversations, None, config, tokenizer).summary
    assert summary.split_at == ("support.jsonl:2", "support.jsonl:3") and summary.dropped_at == ("support.jsonl:3",)
    assert summary.examples == 1 + summary.split_records and summary.max_record_tokens <= 200
    assert summary.max_seq_len == 200 and summary.max_seq_len_reason is None

    auto = prepare_conversations(conversations, None, RunConfig(data="support.jsonl", val_fraction=0), tokenizer)
    lengths = [chat.total_tokens for chat in (ChatTokenizer(tokenizer).tokenize_whole(r) for c in conversations
                                               for r in build_records(c, 0, "all"))]  # fmt: skip
    assert auto.summary.max_seq_len == max(lengths) and auto.summary.examples == 3 and not auto.summary.split_at
    assert "every record trains whole" in auto.summary.max_seq_len_reason
    assert np.array_equal(np.sort(auto.train.lengths), np.sort(lengths))


def test_without_a_model_validate_and_plan_fit_the_estimates_alike(tmp_path):
    """No tokenizer: the same policy on token estimates, and the same summary from validate and plan."""
    import json

    from finetune.commands.plan import make_plan
    from finetune.data.validate import validate_file
    from finetune.settings.wording import render

    conversations = [_support_thread(1, line=1), _support_thread(8, line=2), _support_thread(3, 20, 3, long_turn=1)]
    rows = [{"messages": [{"role": m.role, "content": m.content} for m in c.messages]} for c in conversations]
    path = tmp_path / "support.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    validated = validate_file(str(path), max_seq_len=300)
    summary = [(p.code, render(p.message)) for p in validated.warnings if p.line is None]  # as the CLI shows it
    assert [code for code, _ in summary] == ["conversations_split", "dropped_examples"] and validated.ok
    plan = make_plan(RunConfig(data=str(path), max_seq_len=300, val_fraction=0))
    assert [(w["code"], w["message"]) for w in plan.warnings if w["code"] in dict(summary)] == summary
    assert plan.data.split_at == ("support.jsonl:2", "support.jsonl:3") and plan.max_seq_len == 300
    assert plan.data.dropped_at == ("support.jsonl:3",) and not plan.data.counted_with_tokenizer


@pytest.mark.parametrize("with_model", [True, False], ids=["tokenized", "estimated"])
def test_plan_lists_the_dropped_lines_in_file_order(tmp_path, toy_model, with_model):
    """Issue 35: `plan` listed the dropped lines of the training side, then those of the validation side
    (long.jsonl:18, 34, 42, then 6 and 53): every list of lines is in file order."""
    import json

    from finetune.commands.plan import make_plan
    from finetune.settings.wording import render

    long_lines = (6, 18, 34, 42, 53)
    rows = [
        {"messages": [{"role": "user", "content": f"question {n}"},
                      {"role": "assistant", "content": "ok " * (400 if n in long_lines else 5)}]}
        for n in range(1, 61)
    ]  # fmt: skip
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model = {"model": str(toy_model)} if with_model else {}
    plan = make_plan(RunConfig(data=str(path), max_seq_len=128, val_fraction=0.3, **model))
    assert plan.data.dropped_at == tuple(f"long.jsonl:{n}" for n in long_lines)
    if with_model:
        assert plan.data.dropped_lines == long_lines
    shown = next(render(w["message"]) for w in plan.warnings if w["code"] == "dropped_examples")
    assert shown.endswith(": long.jsonl:6, long.jsonl:18, long.jsonl:34 and 2 more"), shown
