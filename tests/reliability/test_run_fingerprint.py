"""--resume refuses a run that is not the checkpoint's: another data file of the same length, another model of
the same shape, another learning rate or LoRA rank, each named; --allow-changes lets the carry-over ones through."""

from __future__ import annotations

import shutil

import pytest

from finetune.data.types import DataSummary
from finetune.plan.build import build_plan
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import check_resume, model_identity, parse_allowed, run_fingerprint


def _plan(data, model, **settings):
    """A real plan of the run (Auto's choices resolved) for a small what-if data summary."""
    values = dict(epochs=2, batch_size=4, lr=2e-4, lora_rank=8, seed=0, gpu="cpu") | settings
    config = RunConfig(data=str(data), model=str(model), **values)
    summary = DataSummary(
        examples=16, validation_examples=4, conversations=16, validation_conversations=4, messages=32,
        tokens_in_file=1600, val_fraction=0.2,
    )  # fmt: skip
    return build_plan(config, summary)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    return path


def _fingerprint(data, model, **settings):
    return run_fingerprint(_plan(data, model, **settings))


def test_same_run_has_the_same_fingerprint(data, toy_model):
    assert check_resume(_fingerprint(data, toy_model), _fingerprint(data, toy_model), None, "step-2") == []


def test_a_renamed_data_file_with_the_same_bytes_is_the_same_data(data, toy_model, tmp_path):
    moved = tmp_path / "moved.jsonl"
    shutil.copy(data, moved)
    assert check_resume(_fingerprint(data, toy_model), _fingerprint(moved, toy_model), None, "step-2") == []


def test_other_data_with_the_same_line_count_is_refused(data, toy_model):
    saved = _fingerprint(data, toy_model)
    data.write_text(data.read_text().replace("hello", "howdy"))
    with pytest.raises(UserError, match=r"the training data changed \(train.jsonl, content [0-9a-f]{12} then"):
        check_resume(saved, _fingerprint(data, toy_model), None, "step-2")


def test_another_model_of_the_same_shape_is_refused(data, toy_model, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(toy_model, twin)  # same config, same headers: only where it lives tells them apart
    assert model_identity(str(twin))["sha256"] == model_identity(str(toy_model))["sha256"]
    with pytest.raises(UserError, match="the model changed"):
        check_resume(_fingerprint(data, toy_model), _fingerprint(data, twin), None, "step-2")


def test_a_new_lr_is_refused_naming_it_and_allowed_with_allow_changes(data, toy_model):
    saved = _fingerprint(data, toy_model)
    now = _fingerprint(data, toy_model, lr=1e-3)
    with pytest.raises(UserError) as caught:
        check_resume(saved, now, None, "step-000002")
    message = str(caught.value)
    assert "the learning rate changed (0.0002 then, 0.001 now)" in message
    assert "--allow-changes lr" in message and "\n" not in message
    (change,) = check_resume(saved, now, "lr", "step-000002")
    assert change.to_dict() == {"setting": "lr", "before": 2e-4, "now": 1e-3}


def test_a_new_dpo_beta_is_refused_and_allowed(data, toy_model):
    saved = _fingerprint(data, toy_model, method="dpo", beta=0.1)
    now = _fingerprint(data, toy_model, method="dpo", beta=0.3)
    with pytest.raises(UserError, match=r"the beta changed \(0.1 then, 0.3 now\)"):
        check_resume(saved, now, None, "step-000002")
    (change,) = check_resume(saved, now, "beta", "step-000002")
    assert change.key == "beta"


def test_another_lora_rank_is_refused_and_cannot_be_allowed(data, toy_model):
    saved = _fingerprint(data, toy_model)
    now = _fingerprint(data, toy_model, lora_rank=16)
    with pytest.raises(UserError, match="the LoRA rank changed \\(8 then, 16 now\\), which a checkpoint cannot"):
        check_resume(saved, now, "lora_rank", "step-2")


def test_every_change_is_named_at_once(data, toy_model):
    saved = _fingerprint(data, toy_model)
    now = _fingerprint(data, toy_model, lr=1e-3, batch_size=8, seed=3)
    with pytest.raises(UserError) as caught:
        check_resume(saved, now, None, "step-2")
    for part in ("the learning rate changed", "the effective batch changed", "the seed changed"):
        assert part in str(caught.value)


def test_unknown_allow_changes_name_is_a_flag_error():
    assert parse_allowed("lr, data,val-file,lora-alpha") == ["lr", "data", "val_file", "lora_alpha"]
    with pytest.raises(UserError, match="--allow-changes: unknown setting colour"):
        parse_allowed("lr,colour")
