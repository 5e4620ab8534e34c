"""Stats: conversations vs messages vs records (by policy), estimated and exact tokens, overlong records, pre-flight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.data.stats import (
    build_all_records,
    estimate_record_tokens,
    estimate_tokens,
    percentile,
    summarize,
)
from finetune.data.types import Conversation, Message
from finetune.data.validate import validate_file


def two_replies() -> Conversation:
    return Conversation(
        (
            Message("system", "s"),
            Message("user", "q1"),
            Message("assistant", "a1"),
            Message("user", "q2"),
            Message("assistant", "a2"),
        ),
        line=1,
    )


def run_json(argv: list[str], capsys) -> tuple[int, dict]:
    rc = main(["validate", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- arithmetic


@pytest.mark.parametrize(
    ("values", "q", "expected"), [([], 50, 0), ([7], 95, 7), ([1, 2, 3, 4], 50, 2), ([1, 2, 3, 4], 90, 4)]
)
def test_percentile_is_nearest_rank(values: list[int], q: float, expected: int) -> None:
    assert percentile(values, q) == expected


def test_percentile_of_1_to_100() -> None:
    values = list(range(100, 0, -1))
    assert [percentile(values, q) for q in (50, 90, 95, 100)] == [50, 90, 95, 100]


def test_estimate_is_a_quarter_of_the_utf8_bytes() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("é" * 4) == 2  # 8 bytes


def test_estimated_record_counts_template_and_end_of_turn() -> None:
    conversation = Conversation((Message("user", "x" * 8), Message("assistant", "y" * 12)), line=1)
    (record,) = build_all_records([conversation], "all")
    counts = estimate_record_tokens(record, max_seq_len=10)
    assert counts.total == (2 + 4) + (3 + 4)
    assert counts.target == 3 + 1
    assert counts.context == counts.total - counts.target
    assert counts.cut == 3


# ----------------------------------------------------------------------------- records vs messages


@pytest.mark.parametrize(("policy", "records"), [("all", 1), ("last", 1), ("each", 2)])
def test_records_follow_the_policy_messages_do_not(policy: str, records: int) -> None:
    conversations = [two_replies()]
    counts = [estimate_record_tokens(r, 1024) for r in build_all_records(conversations, policy)]
    stats = summarize(conversations, counts, policy, 1024, tokens_exact=False)
    assert (stats["conversations"], stats["messages"], stats["records"]) == (1, 5, records)
    assert stats["record_policy"] == policy
    assert stats["tokens_exact"] is False


def test_zero_weight_reply_is_not_a_record_target(write_file, chat, capsys) -> None:
    path = write_file([chat(("user", "a"), ("assistant", "b", 0), ("user", "c"), ("assistant", "d"))])
    rc, report = run_json([path, "--record-policy", "each"], capsys)
    assert rc == 0
    assert report["stats"]["records"] == 1 and report["stats"]["messages"] == 4


def test_cli_stats_name_conversations_messages_and_records(write_file, chat, capsys) -> None:
    path = write_file([chat(("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2"))] * 1)
    assert main(["validate", path, "--record-policy", "each"]) == 0
    out = capsys.readouterr().out
    assert "conversations" in out and "messages" in out and "training records" in out
    assert "≈" in out  # estimated without --model


def test_too_long_without_model_is_shortened_on_estimates(write_file, chat, capsys) -> None:
    path = write_file([chat(("user", "q" * 400), ("assistant", "a" * 40))])
    rc, report = run_json([path, "--max-seq-len", "50"], capsys)
    assert rc == 0
    (warning,) = report["warnings"]
    assert warning["code"] == "truncated_examples" and warning["line"] is None
    assert (
        warning["message"].startswith("1 record longer than 50 tokens shortened")
        and f"{Path(path).name}:1" in warning["message"]
    )
    total = (100 + 4) + (10 + 4)
    assert report["stats"]["over_max_seq_len"] == {"records": 1, "tokens_cut": total - 50}
    assert report["stats"]["long_records"]["shortened_records"] == 1


def test_stats_count_only_usable_conversations(write_file, chat, capsys) -> None:
    path = write_file([chat(("user", "q"), ("assistant", "a")), "oops", chat(("user", "q"))])
    rc, report = run_json([path], capsys)
    assert rc == 1
    assert report["stats"]["conversations"] == 1 and report["stats"]["records"] == 1


@pytest.mark.parametrize("argv", [["--max-seq-len", "0"], ["--show", "-1"]])
def test_bad_flags_exit_1(argv: list[str], write_file, chat, capsys) -> None:
    assert main(["validate", write_file([chat(("user", "q"), ("assistant", "a"))]), *argv]) == 1
    assert "error:" in capsys.readouterr().err


# ----------------------------------------------------------------------------- with the model's tokenizer


def test_exact_stats_with_model(toy_model_dir, write_file, chat, capsys) -> None:
    path = write_file([chat(("user", "Where is my order?"), ("assistant", "It ships today."), system="Be brief.")])
    rc, report = run_json([path, "--model", toy_model_dir], capsys)
    assert rc == 0, report
    stats = report["stats"]
    assert stats["tokens_exact"] is True
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(toy_model_dir)
    reply = tok("It ships today.", add_special_tokens=False)["input_ids"]
    assert stats["target_tokens"] == len(reply) + 1  # the reply and its end-of-turn
    assert stats["record_tokens"]["max"] == stats["target_tokens"] + stats["context_tokens"]


def test_exact_too_long_is_shortened_or_dropped_never_an_error(toy_model_dir, write_file, chat, capsys) -> None:
    """Issue 26: an over-long record is fitted as training fits it and summed up as a warning (exit 0); only a
    file where nothing trainable remains is unusable, and --strict makes each such line an error."""
    long_context = chat(("user", "tell me " * 60), ("assistant", "Sure."))
    path = write_file([long_context])
    rc, report = run_json([path, "--model", toy_model_dir, "--max-seq-len", "40"], capsys)
    assert rc == 0  # only context is cut: a warning
    (warning,) = report["warnings"]
    assert warning["code"] == "truncated_examples" and "about" not in warning["message"]
    assert report["stats"]["over_max_seq_len"]["tokens_cut"] > 0

    rc, report = run_json([path, "--model", toy_model_dir, "--max-seq-len", "4"], capsys)
    assert rc == 1  # the reply itself would be cut, and it is the only record: nothing trainable remains
    assert [(e["code"], e["line"]) for e in report["errors"]] == [("nothing_trainable", None)]

    short = chat(("user", "hi"), ("assistant", "Hello."))  # 19 tokens with the toy template
    long_reply = chat(("user", "hi"), ("assistant", "word " * 40))
    path = write_file([short, long_reply, chat(("user", "hey"), ("assistant", "Hi."))])
    rc, report = run_json([path, "--model", toy_model_dir, "--max-seq-len", "20"], capsys)
    assert rc == 0 and report["errors"] == [], report["errors"]  # the others still train
    (dropped,) = report["warnings"]
    assert dropped["code"] == "dropped_examples" and "1 record dropped" in dropped["message"]
    assert dropped["message"].endswith(f": {Path(path).name}:2") and report["stats"]["records"] == 2

    rc, report = run_json([path, "--model", toy_model_dir, "--max-seq-len", "20", "--strict"], capsys)
    assert rc == 1 and [(e["code"], e["line"]) for e in report["errors"]] == [("too_long", 2)]
    assert "--strict" in report["errors"][0]["message"] and "dropped" in report["errors"][0]["message"]


def test_preflight_catches_masking_bugs(toy_model_dir, write_file, chat, capsys, monkeypatch) -> None:
    """Simulate masking bugs (end-of-turn never scored; a record with nothing scored): validation must refuse."""
    from finetune.data.tokenize import ChatTokenizer

    original = ChatTokenizer.tokenize_whole

    def broken(self, record):
        outcome = original(self, record)
        unscored = outcome.input_ids == self.end_of_turn_id if record.line == 1 else outcome.weights > 0
        outcome.weights[unscored] = 0
        return outcome

    monkeypatch.setattr(ChatTokenizer, "tokenize_whole", broken)
    path = write_file(
        [chat(("user", "Question?"), ("assistant", "Answer.")), chat(("user", "Why?"), ("assistant", "Because."))]
    )
    rc, report = run_json([path, "--model", toy_model_dir], capsys)
    assert rc == 1
    assert [(e["code"], e["line"]) for e in report["errors"]] == [
        ("end_of_turn_not_scored", None),
        ("no_target_tokens", 2),
    ]


def test_validate_file_library_call(toy_model_dir, write_file, chat) -> None:
    from transformers import AutoTokenizer

    conversation = chat(
        ("user", "First question?"), ("assistant", "First answer."), ("user", "More?"), ("assistant", "Done.")
    )
    path = write_file([conversation])
    result = validate_file(path, AutoTokenizer.from_pretrained(toy_model_dir), max_seq_len=512, record_policy="each")
    assert result.ok, result.errors
    assert len(result.counts) == 2
    assert all(c.tokenized is not None and c.tokenized.num_targets == c.target for c in result.counts)


def test_reply_that_also_appears_in_the_prompt_is_scored_in_the_reply(toy_model_dir, write_file, chat, capsys) -> None:
    path = write_file([chat(("user", "say yes"), ("assistant", "yes")), chat(("user", "q"), ("assistant", "a"))])
    rc, report = run_json([path, "--model", toy_model_dir, "--show", "1"], capsys)
    assert rc == 0, report["errors"]
    assert report["shown"][0]["text"].endswith(
        "<|im_start|>user\nsay yes<|im_end|>\n<|im_start|>assistant\n[[yes<|im_end|>]]"
    )


def test_empty_reply_scores_its_end_of_turn(toy_model_dir, write_file, chat, capsys) -> None:
    path = write_file([chat(("user", "Question?"), ("assistant", ""))])
    rc, report = run_json([path, "--model", toy_model_dir], capsys)
    assert rc == 0, report["errors"]
    assert report["stats"]["target_tokens"] == 1
    assert [w["code"] for w in report["warnings"]] == ["empty_content"]


def test_unloadable_model_exits_1(tmp_path, write_file, chat, capsys) -> None:
    path = write_file([chat(("user", "q"), ("assistant", "a"))])
    assert main(["validate", path, "--model", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
