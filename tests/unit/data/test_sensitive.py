"""Sensitive data found before training (docs/sensitive-data.md): a file with planted e-mails, card numbers (one
failing Luhn, which must not count), an IBAN, a phone number and secrets, in user and assistant messages.

`validate` counts them by kind and role and names the lines, and no planted value is printed (text or JSON);
`redact` tokenizes placeholders, so the decoded tokens hold none of the values; `refuse` stops before planning
with one message; the setting is in the token cache's key and resume refuses a change of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from planted_values import SPLIT_EMAIL, STRUCTURED, structured_row, write_rows

from finetune.commands.cli import main
from finetune.data.convert import conversation_to_openai
from finetune.data.detectors import find_spans
from finetune.data.read import read_file
from finetune.data.redaction import redact_document, redact_line
from finetune.data.sensitive import redact_conversation, scan_conversation
from finetune.settings.config import RunConfig
from finetune.settings.registry import hyperparameter_schema, tokenizing_settings

GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
PRIVATE_KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnz\n-----END RSA PRIVATE KEY-----"
)
INVALID_CARD = "4111 1111 1111 1112"  # fails Luhn: not counted, not replaced, and (as all data) never printed
VALUES = [  # every planted value
    "jane.doe@example.com", "4111 1111 1111 1111", "5555-5555-5555-4444",
    "+44 20 7946 0958", "GB82 WEST 1234 5698 7654 32", "AKIAIOSFODNN7EXAMPLE", GITHUB_TOKEN,
    "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnz",
]  # fmt: skip
PLANTED = [
    ("Hi, I am jane.doe@example.com; my card 4111 1111 1111 1111 was charged twice.",  # line 1
     "Thanks, I wrote to jane.doe@example.com about card 5555-5555-5555-4444."),
    ("Is card 4111 1111 1111 1112 the right one? Call me on +44 20 7946 0958.",  # line 2
     "The refund goes to IBAN GB82 WEST 1234 5698 7654 32 today."),
    ("The deploy fails.", f"Use the key AKIAIOSFODNN7EXAMPLE and the token {GITHUB_TOKEN} for now."),  # line 3
    (f"Here is our key:\n{PRIVATE_KEY}", "Please rotate it, and never paste keys in a ticket."),  # line 4
    ("Where is order 369641 from 2023-11-04?", "It left our warehouse on Monday; it arrives in 2 days."),  # line 5: clean
]  # fmt: skip
EXPECTED_BY_KIND = {"email": 2, "card": 2, "phone": 1, "iban": 1, "secret": 3}
EXPECTED_BY_KIND_AND_ROLE = {
    "email": {"user": 1, "assistant": 1},
    "card": {"user": 1, "assistant": 1},
    "phone": {"user": 1},
    "iban": {"assistant": 1},
    "secret": {"user": 1, "assistant": 2},
}


def _conversation(user: str, assistant: str) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}


@pytest.fixture
def planted(tmp_path) -> Path:
    """The planted lines first, then clean conversations enough for a split (lines 6-25)."""
    clean = [(f"How do I reset the router in room {i}?", f"Hold the reset button for ten seconds, room {i}.")
             for i in range(20)]  # fmt: skip
    path = tmp_path / "planted.jsonl"
    path.write_text("".join(json.dumps(_conversation(u, a)) + "\n" for u, a in PLANTED + clean), encoding="utf-8")
    return path


def _no_value_in(text: str, printed: bool = True) -> None:
    for value in VALUES + ([INVALID_CARD] if printed else []):
        assert value not in text, f"a planted value is there: {value[:6]}..."
    assert "A1b2C3d4" not in text


def test_each_detector_finds_its_kind_and_a_card_failing_luhn_is_none():
    text = " | ".join(u + " " + a for u, a in PLANTED)
    found = [(s.kind, text[s.start : s.end]) for s in find_spans(text)]
    assert ("card", "4111 1111 1111 1111") in found and ("card", "5555-5555-5555-4444") in found
    assert not any("1112" in value for _, value in found)  # Luhn fails: not a card, nor anything else
    assert ("iban", "GB82 WEST 1234 5698 7654 32") in found and ("phone", "+44 20 7946 0958") in found
    assert ("secret", "AKIAIOSFODNN7EXAMPLE") in found and ("secret", GITHUB_TOKEN) in found
    assert ("secret", PRIVATE_KEY) in found  # the whole block, not only its header
    assert not any("369641" in value or "2023" in value for _, value in found)  # an order number, a date
    url = "postgres://admin:s3cretPassw0rd@db.example.com/x"
    assert [(s.kind, url[s.start : s.end]) for s in find_spans(url)] == [("secret", "s3cretPassw0rd")]


def test_validate_counts_by_kind_and_role_names_lines_and_prints_no_value(planted, capsys):
    assert main(["validate", str(planted)]) == 0  # warn: usable, with one warning
    text = capsys.readouterr().out
    assert "[sensitive_data]" in text and "planted.jsonl lines 1, 2, 3, 4" in text
    assert "9 values: 2 e-mail addresses (1 in assistant replies), 1 phone number, 2 payment card numbers" in text
    _no_value_in(text)

    assert main(["validate", str(planted), "--json"]) == 0
    out = capsys.readouterr().out
    _no_value_in(out)
    found = json.loads(out)["sensitive_data"]
    assert found["by_kind"] == EXPECTED_BY_KIND
    assert found["by_kind_and_role"] == EXPECTED_BY_KIND_AND_ROLE
    assert found["by_role"] == {"user": 4, "assistant": 5}
    assert found["files"] == {"planted.jsonl": {"values": 9, "lines": [1, 2, 3, 4], "line_count": 4}}
    assert {(f["line"], f["role"], f["kind"]) for f in found["findings"]} >= {
        (4, "user", "secret"),
        (2, "user", "phone"),
    }
    (warning,) = [w for w in json.loads(out)["warnings"] if w["code"] == "sensitive_data"]
    assert warning["line"] == 1


def test_validate_with_refuse_makes_the_file_unusable(planted, capsys):
    assert main(["validate", str(planted), "--sensitive-data", "refuse"]) == 1
    text = capsys.readouterr().out
    assert "planted.jsonl:1 [sensitive_data]" in text and "NOT USABLE" in text
    _no_value_in(text)


def _decoded(records, tokenizer, targets_only: bool) -> str:
    texts = []
    for i in range(len(records)):
        record = records[i]
        ids = [t for t, label in zip(record.input_ids, record.labels, strict=True) if label != -100 or not targets_only]
        texts.append(tokenizer.decode(ids))
    return "\n".join(texts)


def test_redact_tokenizes_placeholders_and_the_plan_says_how_many(planted, toy_model, tmp_path):
    from finetune.data.dispatch import prepare
    from finetune.data.tokenize import load_tokenizer
    from finetune.plan.build import build_plan

    tokenizer = load_tokenizer(str(toy_model))
    config = RunConfig(data=str(planted), model=str(toy_model), sensitive_data="redact", cache_dir=str(tmp_path / "c"))
    prepared = prepare(config, tokenizer)
    everything = _decoded(prepared.train, tokenizer, False) + _decoded(prepared.val, tokenizer, False)
    _no_value_in(everything, printed=False)
    assert INVALID_CARD in everything  # not a card: left as it is
    assert "<EMAIL>" in everything and "<CARD>" in everything and "<SECRET>" in everything
    targets = _decoded(prepared.train, tokenizer, True) + _decoded(prepared.val, tokenizer, True)
    _no_value_in(targets, printed=False)
    assert "<IBAN>" in targets  # the IBAN was in a reply: its placeholder is what the model learns
    assert prepared.summary.sensitive_found["replaced"] == 9

    (warning,) = [w for w in build_plan(config, prepared.summary).warnings if w["code"] == "sensitive_data"]
    assert warning["message"].startswith("9 sensitive value(s) replaced with placeholders before tokenizing")
    _no_value_in(warning["message"])

    again = prepare(config, tokenizer)  # from the token cache: the same summary, no value
    assert again.from_cache and again.summary.sensitive_found == prepared.summary.sensitive_found
    warned = prepare(RunConfig(**{**config.to_dict(), "sensitive_data": "warn"}), tokenizer)
    assert not warned.from_cache  # another key: the tokens differ
    assert "jane.doe@example.com" in _decoded(warned.train, tokenizer, False) + _decoded(warned.val, tokenizer, False)


def test_redact_without_a_model_estimates_from_placeholders(planted):
    from finetune.data.dispatch import prepare

    summary = prepare(RunConfig(data=str(planted), sensitive_data="redact")).summary
    assert summary.sensitive_found["by_kind"] == EXPECTED_BY_KIND and summary.sensitive_found["replaced"] == 9


@pytest.mark.parametrize("with_model", [False, True])
def test_refuse_stops_before_planning_with_one_message(planted, toy_model, tmp_path, capsys, with_model):
    model = ["--model", str(toy_model)] if with_model else []
    cache = tmp_path / "cache"
    assert main(["plan", str(planted), *model, "--sensitive-data", "refuse", "--cache-dir", str(cache)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # no plan
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("error: sensitive data found, so --sensitive-data refuse stops before planning: 9 values:")
    assert "planted.jsonl lines 1, 2, 3, 4" in line and "3 secrets (2 in assistant replies)" in line
    _no_value_in(captured.err)
    assert not list(cache.rglob("ids.npy"))  # no tokens of it were kept in the token cache


def test_refuse_in_train_writes_no_plan_nor_test_split(planted, toy_model, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", str(planted), "--model", str(toy_model), "--out", str(out), "--sensitive-data", "refuse"]
    assert main([*args, "--test-fraction", "0.2", "--cache-dir", str(tmp_path / "cache")]) == 1
    assert "stops before planning" in capsys.readouterr().err
    assert not (out / "plan.json").exists() and not (out / "test.jsonl").exists()


def test_the_setting_is_declared_once_keyed_in_the_cache_and_refused_on_resume(planted, toy_model):
    from finetune.data.types import DataSummary
    from finetune.plan.build import build_plan
    from finetune.settings.errors import UserError
    from finetune.settings.fingerprint import check_resume, run_fingerprint

    assert "sensitive_data" in tokenizing_settings()
    schema = hyperparameter_schema()["properties"]["sensitive_data"]
    assert schema["enum"] == ["warn", "redact", "refuse"] and schema["default"] == "warn"
    summary = DataSummary(examples=16, validation_examples=4, conversations=16, validation_conversations=4,
                          messages=32, tokens_in_file=1600, val_fraction=0.2)  # fmt: skip

    def fingerprint(setting: str) -> dict:
        values = dict(epochs=2, batch_size=4, lr=2e-4, lora_rank=8, gpu="cpu", sensitive_data=setting)
        return run_fingerprint(build_plan(RunConfig(data=str(planted), model=str(toy_model), **values), summary))

    with pytest.raises(UserError, match="sensitive data changed"):
        check_resume(fingerprint("warn"), fingerprint("redact"), None, "step-2")


def test_preference_pairs_are_scanned_redacted_and_refused(tmp_path, toy_model, capsys):
    from finetune.data.dispatch import prepare
    from finetune.data.tokenize import load_tokenizer
    from finetune.settings.errors import DataError

    def pair(i: int, chosen: str) -> str:
        return json.dumps({"input": {"messages": [{"role": "user", "content": f"Where is my order {i}?"}]},
                           "preferred_output": [{"role": "assistant", "content": chosen}],
                           "non_preferred_output": [{"role": "assistant", "content": "No idea."}]}) + "\n"  # fmt: skip

    path = tmp_path / "prefs.jsonl"
    path.write_text(pair(0, "Write to jane.doe@example.com, card 4111 1111 1111 1111.") +
                    "".join(pair(i, f"It arrives in {i} days.") for i in range(1, 12)))  # fmt: skip
    tokenizer = load_tokenizer(str(toy_model))
    config = dict(data=str(path), model=str(toy_model), method="dpo")
    prepared = prepare(RunConfig(**config, sensitive_data="redact"), tokenizer)
    assert prepared.summary.sensitive_found["by_kind_and_role"] == {"email": {"assistant": 1}, "card": {"assistant": 1}}
    chosen = "\n".join(tokenizer.decode(p.chosen.input_ids) for p in prepared.train + prepared.val)
    assert "<EMAIL>" in chosen and "<CARD>" in chosen
    _no_value_in(chosen)
    with pytest.raises(DataError, match="stops before planning: 2 values"):
        prepare(RunConfig(**config, sensitive_data="refuse"), tokenizer)
    assert main(["validate", str(path), "--json"]) == 0  # `finetune validate PREFS.jsonl` counts them too
    out = capsys.readouterr().out
    _no_value_in(out)
    assert json.loads(out)["sensitive_data"]["by_kind_and_role"]["email"] == {"assistant": 1}
    assert main(["validate", str(path), "--sensitive-data", "refuse"]) == 1
    assert "prefs.jsonl:1 [sensitive_data]" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text",
    [
        "our bot uses xoxb-1234567890-0987654321-abcdefghijklmnop",
        "token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "GitLab: glpat-abcdefghij0123456789XYZ",
        "config: ibm_cloud_api_key = 'abcdefghijABCDEFGHIJ0123456789abcdefghij0123'",
        "Stripe sk_live_" + "0123456789abcdefghijABCD",
        "cloudant_password='abcdefghijklmnopqrstuvwx'",
        "npm //registry.npmjs.org/:_authToken=npm_abcdefghijklmnop",
    ],
)
def test_secret_detectors_still_find_their_values_past_the_quick_word_check(text):
    assert [s.kind for s in find_spans(text)] == ["secret"]


def test_a_redacted_copy_of_a_line_keeps_its_format_and_loses_every_value():
    """What the copies of the data hold with redact (data/redaction.py, issue 42): each JSON string redacted, the
    rest of the line as it was (any format, a field no reader trains on included, a duplicate key a reader refuses);
    a line that is not JSON, as text."""
    alpaca = json.dumps({"instruction": f"Mail {VALUES[0]}", "output": "ok", "ticket": {"card": VALUES[1]}})
    assert json.loads(redact_line(alpaca)) == {
        "instruction": "Mail <EMAIL>",
        "output": "ok",
        "ticket": {"card": "<CARD>"},
    }
    chat = json.dumps(_conversation(f"Here is our key:\n{PRIVATE_KEY}", "Thanks."))
    assert json.loads(redact_line(chat)) == _conversation("Here is our key:\n<SECRET>", "Thanks.")
    assert redact_line('{"a": "x", "a": "y"}') == '{"a": "x", "a": "y"}'  # nothing found: the very same bytes
    assert redact_line('{"a": "jane.doe@example.com", "a": 1}') == '{"a": "<EMAIL>", "a": 1}'
    assert redact_line(f"not JSON: {VALUES[5]} and {VALUES[2]}") == "not JSON: <SECRET> and <CARD>"
    assert redact_document({"messages": [{"content": VALUES[3]}], "n": 3}) == {
        "messages": [{"content": "<PHONE>"}],
        "n": 3,
    }


def test_values_in_every_shape_json_gives_them_are_found_and_redacted_so_the_copy_reads_the_same(tmp_path):
    """Issue 47, as an attacker would plant them: a card and a phone number as JSON numbers in a tool call's arguments
    (an object, nested, and a JSON string), an address as an argument's key, in a tool schema and split over two
    content parts. The reader finds each (in the text the template renders), redaction keeps the arguments and the
    schema JSON, and the conversation written out (the copies' form) reads back as trained, with no value left."""
    row = structured_row(0)
    path = tmp_path / "attack.jsonl"
    write_rows(path, [row])
    conversation = read_file(str(path)).conversations[0]
    found = scan_conversation(conversation)
    assert sorted({f.field for f in found}) == [
        "content",
        "name",
        "tool_calls[0].arguments",
        "tool_calls[1].arguments",
        "tools[0]",
    ]
    assert len(found) == len(STRUCTURED) + 1  # each planted value once, and the address the two parts make
    clean = redact_conversation(conversation, found)
    assert scan_conversation(clean) == []
    assert json.loads(clean.messages[1].tool_calls[0].arguments)["card"] == "<CARD>"  # still a JSON object
    written = json.dumps(conversation_to_openai(clean))
    write_rows(path, [json.loads(written)])
    assert read_file(str(path)).conversations[0].messages == clean.messages  # the copy reads as it was trained
    for needle in [str(v) for v in STRUCTURED.values()] + [SPLIT_EMAIL[0], "".join(SPLIT_EMAIL)]:
        assert needle not in written


def test_a_line_no_reader_parsed_loses_numbers_keys_and_split_values_and_keeps_its_shape():
    """Issue 47: a line left out as invalid is redacted value by value wherever JSON holds one."""
    invalid = structured_row(1)
    invalid["messages"][0]["role"] = "customer"
    text = redact_line(json.dumps(invalid))
    for needle in [str(v) for v in STRUCTURED.values()] + [SPLIT_EMAIL[0], SPLIT_EMAIL[1]]:
        assert needle not in text
    redacted_row = json.loads(text)
    assert redacted_row["messages"][0]["content"][0]["text"].endswith("Write to me at <EMAIL>")
    assert redacted_row["messages"][0]["role"] == "customer"  # invalid as it was: the reader says the same of it
    assert json.loads(redacted_row["messages"][1]["tool_calls"][1]["function"]["arguments"])["phone"] == "<PHONE>"
    assert redact_line('{"n": 1.50, "ok": true, "id": 12}') == '{"n": 1.50, "ok": true, "id": 12}'
    assert redact_line('{"a": 4111111111111111, "a": 2}') == '{"a": "<CARD>", "a": 2}'
