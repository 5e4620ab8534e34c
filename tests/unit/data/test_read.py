"""read_file and `finetune validate`: one tiny bad file per code, several problems at once, exit codes, --json."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.commands.cli import main
from finetune.data import fitting, validate
from finetune.data.formats import lines as lines_module
from finetune.data.read import parse_bytes, read_file
from finetune.settings.errors import UserError

GOOD = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
GOOD_PC = '{"prompt": "2+2?", "completion": "4"}'


def lines(*items: str) -> bytes:
    return "".join(item + "\n" for item in items).encode("utf-8")


def msgs(*messages: str) -> str:
    return '{"messages": [' + ", ".join(messages) + "]}"


USER = '{"role": "user", "content": "hi"}'
ASSISTANT = '{"role": "assistant", "content": "hello"}'
SYSTEM = '{"role": "system", "content": "be brief"}'

# (id, file bytes, expected errors as (code, line)) -- exactly these errors, in this order
ERROR_CASES = [
    ("empty_file", b"", [("empty_file", None)]),
    ("empty_file_blank_lines", b"\n  \n\r\n", [("empty_file", None)]),
    ("empty_file_only_bom", b"\xef\xbb\xbf", [("empty_file", None), ("bom", 1)]),
    ("not_utf8", lines(GOOD).replace(b"\n", b"\n\xff\xfe{}\n", 1), [("not_utf8", 2)]),
    (
        "not_utf8_latin1_content",
        lines(GOOD) + msgs(USER, ASSISTANT).replace("hello", "caf\xe9").encode("latin-1") + b"\n",
        [("not_utf8", 2)],
    ),
    ("bom", b"\xef\xbb\xbf" + lines(GOOD, GOOD.replace("hi", "yo")), [("bom", 1)]),
    ("bom_utf16", "\ufeff".encode("utf-16-le") + GOOD.encode("utf-16-le"), [("bom", 1)]),
    ("not_json", lines(GOOD, '{"messages": [}'), [("not_json", 2)]),
    ("not_json_trailing_garbage", lines(GOOD + " x"), [("not_json", 1)]),
    ("not_json_deep_nesting", lines("[" * 100_000 + "]" * 100_000), [("not_json", 1)]),
    ("not_json_huge_integer", lines('{"messages": ' + "9" * 5000 + "}"), [("not_json", 1)]),
    ("not_object_array", lines("[1, 2]"), [("not_object", 1)]),
    ("not_object_string", lines(GOOD, '"hello"'), [("not_object", 2)]),
    ("not_object_null", lines("null"), [("not_object", 1)]),
    ("missing_messages", lines("{}"), [("missing_messages", 1)]),
    ("missing_messages_null", lines('{"messages": null}'), [("missing_messages", 1)]),
    ("missing_messages_other_key", lines(GOOD, '{"text": "hi"}'), [("unknown_key", 2), ("missing_messages", 2)]),
    ("messages_not_list", lines('{"messages": "hi"}'), [("messages_not_list", 1)]),
    ("empty_messages", lines(GOOD, '{"messages": []}'), [("empty_messages", 2)]),
    ("unknown_key_top", lines('{"messages": [' + USER + ", " + ASSISTANT + '], "id": 7}'), [("unknown_key", 1)]),
    (
        "unknown_key_message",
        lines(msgs(USER, '{"role": "assistant", "content": "x", "wieght": 1}')),
        [("unknown_key", 1)],
    ),
    ("message_not_object", lines(msgs(USER, '"hello"')), [("message_not_object", 1)]),
    ("missing_role", lines(msgs(USER, '{"content": "hello"}')), [("missing_role", 1)]),
    ("unknown_role", lines(msgs(USER, '{"role": "bot", "content": "hello"}')), [("unknown_role", 1)]),
    (
        "unknown_role_function_call",
        lines(GOOD, msgs(USER, '{"role": "function_call", "content": "42"}')),
        [("unknown_role", 2)],
    ),
    ("unknown_role_not_string", lines(msgs(USER, '{"role": 3, "content": "hello"}')), [("unknown_role", 1)]),
    ("missing_content", lines(msgs('{"role": "user"}', ASSISTANT)), [("missing_content", 1)]),
    ("missing_content_null", lines(msgs('{"role": "user", "content": null}', ASSISTANT)), [("missing_content", 1)]),
    ("content_not_string", lines(msgs(USER, '{"role": "assistant", "content": 42}')), [("content_not_string", 1)]),
    (
        "content_part_without_text",
        lines(msgs('{"role": "user", "content": [{"type": "text"}]}', ASSISTANT)),
        [("content_not_string", 1)],
    ),
    (
        "invalid_unicode",
        lines(msgs('{"role": "user", "content": "bad \\ud800 escape"}', ASSISTANT)),
        [("invalid_unicode", 1)],
    ),
    ("no_target_only_user", lines(GOOD, msgs(USER)), [("no_target", 2)]),
    ("no_target_weight_0", lines(msgs(USER, '{"role": "assistant", "content": "x", "weight": 0}')), [("no_target", 1)]),
    (
        "bad_weight_above_1",
        lines(msgs(USER, '{"role": "assistant", "content": "x", "weight": 2}')),
        [("bad_weight", 1)],
    ),
    (
        "bad_weight_negative",
        lines(msgs(USER, '{"role": "assistant", "content": "x", "weight": -0.5}')),
        [("bad_weight", 1)],
    ),
    (
        "bad_weight_string",
        lines(msgs(USER, '{"role": "assistant", "content": "x", "weight": "1"}')),
        [("bad_weight", 1)],
    ),
    (
        "bad_weight_bool",
        lines(msgs(USER, '{"role": "assistant", "content": "x", "weight": true}')),
        [("bad_weight", 1)],
    ),
    (
        "bad_weight_null",
        lines(msgs(USER, '{"role": "assistant", "content": "x", "weight": null}')),
        [("bad_weight", 1)],
    ),
    ("bad_weight_nan", lines(msgs(USER, '{"role": "assistant", "content": "x", "weight": NaN}')), [("bad_weight", 1)]),
    (
        "bad_weight_on_user",
        lines(msgs('{"role": "user", "content": "hi", "weight": 1}', ASSISTANT)),
        [("bad_weight", 1)],
    ),
    ("bad_role_order_assistant_first", lines(msgs(ASSISTANT, USER, ASSISTANT)), [("bad_role_order", 1)]),
    ("bad_role_order_two_users", lines(msgs(USER, USER, ASSISTANT)), [("bad_role_order", 1)]),
    ("bad_role_order_ends_with_user", lines(msgs(USER, ASSISTANT, USER)), [("bad_role_order", 1)]),
    ("bad_role_order_system_later", lines(msgs(USER, SYSTEM, ASSISTANT)), [("bad_role_order", 1)]),
    ("bad_role_order_two_systems", lines(msgs(SYSTEM, SYSTEM, USER, ASSISTANT)), [("bad_role_order", 1)]),
    ("mixed_formats", lines(GOOD, GOOD_PC, GOOD.replace("hi", "yo")), [("mixed_formats", 2)]),
    ("mixed_formats_pc_first", lines(GOOD_PC, GOOD), [("mixed_formats", 2)]),
    ("pc_missing_completion", lines(GOOD_PC, '{"prompt": "hi"}'), [("missing_content", 2)]),
    ("pc_completion_not_string", lines('{"prompt": "hi", "completion": 4}'), [("content_not_string", 1)]),
    ("pc_unknown_key", lines('{"prompt": "hi", "completion": "4", "weight": 1}'), [("unknown_key", 1)]),
]

# (id, file bytes, expected warnings as (code, line)) -- the file stays usable
WARNING_CASES = [
    ("blank_line", lines(GOOD, "", GOOD.replace("hi", "yo")), [("blank_line", 2)]),
    ("blank_line_whitespace", lines(GOOD, "   \t", GOOD.replace("hi", "yo")), [("blank_line", 2)]),
    ("duplicate", lines(GOOD, GOOD.replace("hi", "yo"), GOOD), [("duplicate", 3)]),
    ("empty_content", lines(msgs('{"role": "user", "content": "  "}', ASSISTANT)), [("empty_content", 1)]),
    ("empty_completion", lines('{"prompt": "hi", "completion": ""}'), [("empty_content", 1)]),
]


def codes(problems) -> list[tuple[str, int | None]]:
    return [(p.code, p.line) for p in problems]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_each_error_code_is_reported_with_its_line(data: bytes, expected: list) -> None:
    parsed = parse_bytes(data, "f.jsonl")
    assert codes(parsed.errors) == expected
    assert not parsed.ok
    assert all(p.message and not p.message.startswith(" ") for p in parsed.errors)


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in WARNING_CASES], ids=[c[0] for c in WARNING_CASES])
def test_each_warning_code_leaves_the_file_usable(data: bytes, expected: list) -> None:
    parsed = parse_bytes(data, "f.jsonl")
    assert parsed.errors == []
    assert codes(parsed.warnings) == expected
    assert parsed.ok


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_each_error_exits_1_and_is_in_json(data: bytes, expected: list, write_file, capsys) -> None:
    path = write_file(data)
    assert main(["validate", path, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert [(e["code"], e["line"]) for e in report["errors"]] == expected


def test_every_code_is_documented() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "formats.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z_0-9]+)` \| (?:error|warning) \|", doc, flags=re.M))
    constants = {
        value
        for module in (lines_module, validate, fitting)
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"[a-z][a-z_0-9]+", value)
    }
    constants -= {"chat", "prompt_completion", "sharegpt", "alpaca"}  # format names, not codes
    tested = {code for case in ERROR_CASES + WARNING_CASES for code, _ in case[2]}
    assert tested <= documented
    assert constants <= documented, constants - documented


# ----------------------------------------------------------------------------- good files


def test_good_chat_file(chat, write_file) -> None:
    path = write_file(
        [
            chat(("user", "hi"), ("assistant", "hello"), system="be brief"),
            chat(("user", "a"), ("assistant", "b", 0), ("user", "c"), ("assistant", "d", 0.25)),
            chat(("user", "x"), ("assistant", "y", 1)),
        ]
    )
    parsed = read_file(path)
    assert parsed.ok and parsed.warnings == []
    assert parsed.format == "chat"
    assert [c.line for c in parsed.conversations] == [1, 2, 3]
    assert [m.weight for m in parsed.conversations[1].messages] == [1.0, 0.0, 1.0, 0.25]


def test_prompt_completion_becomes_user_and_assistant(write_file) -> None:
    parsed = read_file(write_file([GOOD_PC]))
    assert parsed.ok and parsed.format == "prompt_completion"
    (conversation,) = parsed.conversations
    assert [(m.role, m.content, m.weight) for m in conversation.messages] == [
        ("user", "2+2?", 1.0),
        ("assistant", "4", 1.0),
    ]


def test_crlf_and_missing_final_newline_are_fine(write_file) -> None:
    parsed = read_file(write_file((GOOD + "\r\n" + GOOD.replace("hi", "yo")).encode()))
    assert parsed.ok and parsed.warnings == []
    assert [c.messages[0].content for c in parsed.conversations] == ["hi", "yo"]


def test_bom_is_reported_but_the_lines_are_still_checked() -> None:
    parsed = parse_bytes(b"\xef\xbb\xbf" + lines(GOOD, "oops"))
    assert codes(parsed.errors) == [("bom", 1), ("not_json", 2)]
    assert len(parsed.conversations) == 1


def test_lines_with_errors_give_no_conversation() -> None:
    parsed = parse_bytes(lines(GOOD, msgs(USER), GOOD.replace("hi", "yo")))
    assert [c.line for c in parsed.conversations] == [1, 3]


def test_duplicate_names_the_first_line() -> None:
    parsed = parse_bytes(lines(GOOD, GOOD.replace("hi", "yo"), GOOD))
    (warning,) = parsed.warnings
    assert "line 1" in warning.message


def test_10000_duplicates_are_one_summary_line_in_text_and_json(write_file, capsys) -> None:
    """Issue 26: validate printed one line per copy (10,013 lines for 10,000 copies)."""
    other = GOOD.replace("hi", "yo")
    path = write_file(lines(GOOD, other, *[GOOD] * 10_000, other))
    assert main(["validate", path]) == 0
    out = capsys.readouterr().out
    (summary,) = [line for line in out.splitlines() if "[duplicate]" in line]
    assert summary.startswith(f"{path}:3 [duplicate] 10,001 duplicate conversations (first at lines 3, 4, 5,")
    assert len(out.splitlines()) < 30

    assert main(["validate", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [w["code"] for w in report["warnings"]] == ["duplicate"]
    detail = report["duplicates"]
    assert detail["count"] == 10_001 and len(detail["lines"]) == 1000  # bounded
    assert detail["lines"][0] == {"line": 3, "same_as": 1} and detail["lines"][-1] == {"line": 1002, "same_as": 1}


def test_one_duplicate_names_its_line(write_file, capsys) -> None:
    path = write_file(lines(GOOD, GOOD))
    assert main(["validate", path]) == 0
    assert f"{path}:2 [duplicate] 1 duplicate conversation (line 2)" in capsys.readouterr().out


def test_weights_differ_so_no_duplicate() -> None:
    other = GOOD.replace('"hello"}', '"hello", "weight": 0.5}')
    assert parse_bytes(lines(GOOD, other)).warnings == []


# ----------------------------------------------------------------------------- many problems at once


def test_every_problem_is_reported_not_the_first() -> None:
    data = lines(
        GOOD,
        "not json",
        "[1]",
        "",
        msgs('{"role": "bot", "content": 5, "weight": "x"}'),
        msgs(USER, USER, ASSISTANT),
        GOOD,
    )
    parsed = parse_bytes(data, "f.jsonl")
    assert codes(parsed.errors) == [
        ("not_json", 2),
        ("not_object", 3),
        ("unknown_role", 5),
        ("content_not_string", 5),
        ("bad_weight", 5),
        ("bad_role_order", 6),
    ]
    assert codes(parsed.warnings) == [("blank_line", 4), ("duplicate", 7)]


def test_messages_are_sentences_that_name_the_problem() -> None:
    parsed = parse_bytes(lines(msgs(USER, '{"role": "robot", "content": "x"}')))
    (error,) = parsed.errors
    assert '"robot"' in error.message and "assistant" in error.message and "message 2" in error.message


def test_missing_file_is_a_user_error(tmp_path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_file(str(tmp_path / "nope.jsonl"))


def test_folder_is_a_user_error(tmp_path) -> None:
    with pytest.raises(UserError):
        read_file(str(tmp_path))


# ----------------------------------------------------------------------------- the command


def test_exit_0_when_usable_with_warnings(write_file, capsys) -> None:
    path = write_file(lines(GOOD, "", GOOD))
    assert main(["validate", path]) == 0
    out = capsys.readouterr().out
    assert f"{path}:2 [blank_line]" in out and f"{path}:3 [duplicate]" in out
    assert "OK" in out


def test_exit_1_with_file_line_code_in_human_output(write_file, capsys) -> None:
    path = write_file(lines(GOOD, "{bad"))
    assert main(["validate", path]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2 [not_json] not JSON" in out
    assert "NOT USABLE" in out


def test_missing_file_exits_1_without_traceback(tmp_path, capsys) -> None:
    assert main(["validate", str(tmp_path / "nope.jsonl")]) == 1
    captured = capsys.readouterr()
    assert "no such file" in captured.err and "Traceback" not in captured.err


def test_json_shape(write_file, capsys) -> None:
    path = write_file(lines(GOOD, "", "[1]"))
    assert main(["validate", path, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)  # one JSON document, nothing else on stdout
    assert set(report) == {"ok", "errors", "warnings", "stats"}
    assert report["errors"] == [{"line": 3, "code": "not_object", "message": report["errors"][0]["message"]}]
    assert report["warnings"][0]["code"] == "blank_line"
    for key in ("conversations", "messages", "records", "target_tokens", "context_tokens", "tokens_exact"):
        assert key in report["stats"]
    assert set(report["stats"]["record_tokens"]) == {"p50", "p90", "p95", "max"}


def test_json_ok_file(write_file, capsys) -> None:
    assert main(["validate", write_file(lines(GOOD)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["errors"] == [] and report["warnings"] == []


def test_no_model_path_does_not_import_torch(write_file) -> None:
    path = write_file(lines(GOOD, "oops"))
    code = (
        "import sys; from finetune.commands.cli import main; rc = main(['validate', sys.argv[1], '--json', '--show', '1']);"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]; print(heavy, file=sys.stderr);"
        "sys.exit(rc if not heavy else 3)"
    )
    result = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr


def test_garbage_bytes_exit_1_without_traceback_in_a_subprocess(write_file) -> None:
    garbage = bytes(range(256)) * 3 + b"\n\x00\x00{\xff}\n\xef\xbb\xbf[\n"
    path = write_file(garbage)
    for extra in ([], ["--json"]):
        result = subprocess.run(
            [sys.executable, "-m", "finetune", "validate", path, *extra], capture_output=True, timeout=60
        )
        assert result.returncode == 1
        assert b"Traceback" not in result.stderr and b"Traceback" not in result.stdout
    json.loads(result.stdout)  # --json: still one parseable document


def test_a_cut_string_says_at_column_once(write_file, capsys) -> None:
    """Issue 35: json's own message ends in "at" ("Unterminated string starting at"): it read "at at column 47"."""
    path = write_file(lines(GOOD, '{"messages": [{"role": "user", "content": "cut'))
    assert main(["validate", path]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2 [not_json] not JSON: Unterminated string starting at column 43;" in out, out
    assert "at at" not in out
