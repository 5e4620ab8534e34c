"""Every warning code: one case that triggers it and one close case where it must stay silent."""

from dataclasses import replace
from pathlib import Path

import pytest

from finetune.data import invented
from finetune.data.sensitive import Found, summarize
from finetune.data.types import DataSummary
from finetune.models.facts import load_model_facts
from finetune.plan.advice import WARNING_CODES
from finetune.plan.build import build_plan
from finetune.plan.what_if import what_if_summary
from finetune.rules.auto import auto_lr
from finetune.settings.config import RunConfig

LLAMA_8B = load_model_facts("meta-llama/Llama-3.1-8B")
QWEN_05B = load_model_facts("Qwen/Qwen2.5-0.5B")
LR_FOR_32 = auto_lr("lora", 32, QWEN_05B.hidden_size).value  # Auto's rate for an effective batch of 32
DATA = DataSummary(
    examples=800,
    validation_examples=80,
    conversations=800,
    validation_conversations=80,
    messages=2_400,
    tokens_in_file=400_000,
    max_record_tokens=900,
)

FOUND = summarize([Found(3, 1, "assistant", "email", "content", 10, 30)], "t.jsonl")  # data/sensitive.py's summary
NONE = summarize([], "t.jsonl")
INVENTED = invented.summarize([invented.Invented(4, 1, "identifier")], "t.jsonl", 800)  # data/invented.py's summary
NOTHING_INVENTED = invented.summarize([], "t.jsonl", 800)


def codes(examples=None, tokens=400_000, data=None, model=QWEN_05B, **settings) -> list[str]:
    config = RunConfig(**settings)
    if data is None:
        data = what_if_summary(config, examples, tokens) if examples is not None else DATA
    return [w["code"] for w in build_plan(config, data, model).warnings]


# (code, settings that trigger it, close settings that must not)
CASES = [
    ("epochs_raised_for_small_data", dict(examples=40), dict(examples=800)),
    ("epochs_raised_for_small_data", dict(examples=800, epochs=6), dict(examples=800, epochs=3)),
    ("few_total_steps", dict(examples=100, epochs=3, batch_size=8), dict(examples=100, epochs=3)),
    ("few_total_steps", dict(examples=800, max_steps=20), dict(examples=800, max_steps=60)),
    ("warmup_steps_large_share", dict(examples=100, epochs=3, batch_size=4, warmup_steps=20),
     dict(examples=800, epochs=3, batch_size=8, warmup_steps=20)),
    ("batch_changed_lr_not", dict(examples=800, batch_size=32), dict(examples=800, batch_size=8)),
    ("batch_changed_lr_not", dict(examples=800, batch_size=32, lr=1e-4), dict(examples=800, batch_size=32, lr=LR_FOR_32)),
    ("small_validation_set", dict(data=replace(DATA, validation_examples=12)), dict(data=replace(DATA, validation_examples=30))),
    ("no_validation_set", dict(examples=800, val_fraction=0), dict(examples=800, val_fraction=0.1)),
    ("val_file_emptied", dict(data=replace(DATA, validation_examples=0, duplicates_removed=5), val_file="v.jsonl"),
     dict(data=DATA, val_file="v.jsonl")),
    ("conversations_split", dict(data=replace(DATA, split_at=("t.jsonl:2",), split_records=2)), dict(data=DATA)),
    ("truncated_examples", dict(data=replace(DATA, truncated_records=1, shortened_at=("t.jsonl:3",))), dict(data=DATA)),
    ("dropped_examples", dict(data=replace(DATA, dropped_records=2, dropped_at=("t.jsonl:4", "t.jsonl:9"))),
     dict(data=DATA)),
    ("skipped_lines", dict(data=replace(DATA, skipped_lines=1)), dict(data=DATA)),
    ("duplicate_conversations", dict(data=replace(DATA, duplicate_conversations=12, duplicate_lines=(4, 9))),
     dict(data=DATA)),
    ("records_differ_from_conversations", dict(data=replace(DATA, conversations=300)), dict(data=DATA)),
    ("model_size_unknown", dict(examples=800, model=None), dict(examples=800)),
    ("does_not_fit_device", dict(examples=800, model=LLAMA_8B, method="full", gpu="a100-80gb"),
     dict(examples=800, model=LLAMA_8B, method="lora", gpu="a100-80gb")),
    ("max_steps_cuts_run", dict(examples=800, max_steps=100), dict(examples=800, max_steps=300)),
    ("more_devices_than_examples", dict(examples=3, batch_size=1, devices=4), dict(examples=4, batch_size=1, devices=4)),
    ("tokens_unknown", dict(examples=800, tokens=None), dict(examples=800)),
    ("tokens_estimated", dict(data=replace(DATA, counted_with_tokenizer=False)), dict(data=DATA)),
    ("unknown_device", dict(examples=800, gpu="tpu-v9"), dict(examples=800, gpu="h100")),
    ("sensitive_data", dict(data=replace(DATA, sensitive_found=FOUND)), dict(data=replace(DATA, sensitive_found=NONE))),
    ("invented_specifics", dict(data=replace(DATA, invented_specifics=INVENTED)),
     dict(data=replace(DATA, invented_specifics=NOTHING_INVENTED))),
]  # fmt: skip


@pytest.mark.parametrize(("code", "trigger", "silent"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_warning_fires_and_stays_silent(code, trigger, silent):
    assert code in codes(**trigger)
    assert code not in codes(**silent)


def test_every_code_is_tested_and_documented():
    assert set(WARNING_CODES) == {case[0] for case in CASES}
    doc = (Path(__file__).parents[3] / "docs" / "auto.md").read_text(encoding="utf-8")
    for code in WARNING_CODES:
        assert f"`{code}`" in doc, code


def test_the_duplicates_warning_is_validate_s_summary():
    data = replace(DATA, duplicate_conversations=12, duplicate_lines=tuple(range(5, 15)))
    (warning,) = [w for w in build_plan(RunConfig(), data, QWEN_05B).warnings if w["code"] == "duplicate_conversations"]
    assert warning["message"].startswith(
        "12 duplicate conversations (first at lines 5, 6, 7, 8, 9, 10, 11, 12, 13, 14 ...)"
    )


def test_a_clean_plan_has_no_warnings():
    assert codes(data=DATA) == []


def test_few_steps_suggests_a_batch_not_epochs():
    plan = build_plan(RunConfig(epochs=3, batch_size=8), what_if_summary(RunConfig(), 100, None), QWEN_05B)
    (warning,) = [w for w in plan.warnings if w["code"] == "few_total_steps"]
    assert "39 optimizer steps" in warning["message"] and "batch size of 6" in warning["message"]


def test_batch_changed_lr_not_says_what_auto_would_use():
    plan = build_plan(RunConfig(batch_size=32, lr=1e-4), DATA, QWEN_05B)
    (warning,) = [w for w in plan.warnings if w["code"] == "batch_changed_lr_not"]
    auto_lr = build_plan(RunConfig(batch_size=32), DATA, QWEN_05B).learning_rate
    assert f"{auto_lr:g}" in warning["message"]


def test_data_warnings_are_given_once_by_the_advice():
    data = replace(
        DATA,
        max_seq_len=1024,
        split_at=("t.jsonl:2", "t.jsonl:17"),
        split_records=5,
        dropped_records=5,
        dropped_at=("t.jsonl:4", "t.jsonl:9", "t.jsonl:10", "t.jsonl:12", "t.jsonl:30"),
        dropped_need_tokens=1556,
    )
    plan = build_plan(RunConfig(), data, QWEN_05B)
    codes = [w["code"] for w in plan.warnings]
    assert codes.count("conversations_split") == 1 and codes.count("dropped_examples") == 1
    messages = {w["code"]: w["message"] for w in plan.warnings}
    assert messages["conversations_split"].startswith("2 conversations longer than 1,024 tokens split into 5 records")
    assert messages["conversations_split"].endswith(": t.jsonl:2, t.jsonl:17")
    assert messages["dropped_examples"].startswith("5 records dropped")
    assert "--max-seq-len 1,556 would keep them" in messages["dropped_examples"]
    assert messages["dropped_examples"].endswith(": t.jsonl:4, t.jsonl:9, t.jsonl:10 and 2 more")


def test_warnings_have_code_and_message():
    for warning in build_plan(RunConfig(epochs=9, batch_size=32, lr=1e-3), replace(DATA, examples=50), None).warnings:
        assert set(warning) == {"code", "message", "template", "settings"} and warning["message"]
        assert "\u2983" not in warning["message"]  # rendered for the reader (the command line here)
