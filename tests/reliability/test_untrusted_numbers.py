"""Numbers that cannot be trusted are refused: NaN flags, a negative seed, a NaN gradient, a NaN weight.
No NaN is ever written to a checkpoint or an export; a loss spike is a warning and an unstable diagnosis."""

from __future__ import annotations

import math

import pytest
import torch
from reliability_helpers import assert_clean_failure, cli, train_in_process, weights_finite

from finetune.report.diagnosis import diagnose
from finetune.report.metrics import read_metrics
from finetune.report.stability import SpikeWatch, find_spikes
from finetune.train.checkpoint import list_checkpoints
from finetune.train.loop import TrainingDiverged
from finetune.train.objective import TokenNormalisedSFT


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-grad-norm", "nan"], "--max-grad-norm must be a finite number, got nan"),
        (["--weight-decay", "nan"], "--weight-decay must be a finite number, got nan"),
        (["--price-per-million-tokens", "nan"], "--price-per-million-tokens must be a finite number, got nan"),
        (["--lr", "inf"], "--lr must be a finite number, got inf"),
        (["--seed", "-1"], "--seed must be at least 0, got -1"),
    ],
)
def test_untrusted_flag_values_are_flag_errors(flags, message, tmp_path):
    result = cli("train", "data.jsonl", "--model", "m", "--out", str(tmp_path / "o"), *flags)
    assert_clean_failure(result, message)


def _poison_after(after: int, how: str, monkeypatch):
    """From the step after `step` on, make the gradients (or the weights after the update) NaN."""
    from finetune.train import model as run  # model_for adds the adapter with this module's add_lora

    state = {"on": False}
    real_add_lora = run.add_lora

    def add_lora(*args, **kwargs):
        model = real_add_lora(*args, **kwargs)
        param = next(p for p in model.parameters() if p.requires_grad)
        if how == "gradient":
            param.register_hook(lambda grad: grad * math.nan if state["on"] else grad)
        return model

    real_step = torch.optim.AdamW.step

    def optimizer_step(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        if how == "weight" and state["on"]:
            with torch.no_grad():
                self.param_groups[0]["params"][0].view(-1)[0] = math.inf  # an update that overflowed
        return result

    monkeypatch.setattr(run, "add_lora", add_lora)
    monkeypatch.setattr(torch.optim.AdamW, "step", optimizer_step)
    return lambda row: state.update(on=row["step"] >= after)


@pytest.mark.parametrize(
    ("how", "words"),
    [("gradient", "the gradient norm became nan"), ("weight", "a weight became NaN or infinite in the update")],
)
def test_nan_guard_stops_before_anything_nan_is_saved(toy_model, tmp_path, monkeypatch, how, words):
    out = tmp_path / "run"
    on_step = _poison_after(2, how, monkeypatch)
    with pytest.raises(TrainingDiverged) as caught:
        train_in_process(toy_model, out, on_step=on_step)
    message = str(caught.value)
    assert words in message and "at step 3" in message
    assert f"the last good checkpoint is {out / 'checkpoints' / 'step-000002'}" in message
    assert [p.name for p in list_checkpoints(out)] == ["step-000001", "step-000002"]
    assert all(weights_finite(folder) for folder in list_checkpoints(out))
    assert not (out / "adapter").exists()  # no export of a NaN model


class _SpikeAtStep4(TokenNormalisedSFT):
    """The usual loss, a hundred times larger in every pass of the fourth optimizer step (the loop asks for each
    step's normaliser once, before the step's passes; this run has no validation set)."""

    def __init__(self) -> None:
        self.steps = 0

    def normaliser(self, examples):
        self.steps += 1
        return super().normaliser(examples)

    def loss(self, model, batch):
        loss_sum, metrics = super().loss(model, batch)
        if model.training and self.steps == 4:
            return loss_sum * 100, metrics
        return loss_sum, metrics


def test_loss_spike_is_a_warning_in_the_metrics(toy_model, tmp_path):
    out = tmp_path / "run"
    train_in_process(toy_model, out, objective=_SpikeAtStep4(), max_steps=5, val_fraction=0.0, batch_size=16)
    rows = read_metrics(out / "metrics.jsonl")
    assert [row.get("warning") for row in rows] == [None, None, None, "loss_spike", None]


def test_spike_watch_and_the_unstable_diagnosis():
    assert find_spikes([2.0, 2.1, 1.9, 2.0, 30.0, 2.0, 25.0]) == [4, 6]
    assert find_spikes([9.0, 30.0]) == []  # too little history to judge
    assert SpikeWatch([2.0, 2.0, 2.0]).observe(21.0)
    rows = [{"step": i + 1, "train_loss": 2.0 - 0.01 * i} for i in range(12)]
    rows[8]["train_loss"] = 40.0
    diagnosis = diagnose(rows, steps_per_epoch=12)
    assert diagnosis.kind == "unstable" and "spiked to 40.000 at step 9" in diagnosis.message
