"""plot_loss_curve writes a real PNG, quickly, for every shape of run."""

import math
import random

from finetune.report.plot import plot_loss_curve

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_rows(steps=300, spe=100, eval_every=25, with_val=True):
    rng = random.Random(0)
    rows = []
    for step in range(1, steps + 1):
        r = {
            "step": step,
            "epoch": step / spe,
            "learning_rate": 1e-4,
            "train_loss": 0.6 + 2 * math.exp(-step / 60) + rng.gauss(0, 0.05),
        }
        if with_val and (step % eval_every == 0 or step % spe == 0):
            r["val_loss"] = 1.1 + 4e-6 * (step - 120) ** 2
        rows.append(r)
    return rows


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000  # a drawn chart, not an empty canvas


def test_writes_a_png(tmp_path):  # no timed assertion: the machine's load is not the plot's speed
    path = tmp_path / "out" / "loss_curve.png"
    returned = plot_loss_curve(run_rows(), path, steps_per_epoch=100, best_step=125, title="team-support, LoRA r=16")
    assert returned == path
    assert_png(path)
    assert not (tmp_path / "out" / "loss_curve.png.tmp").exists()


def test_without_validation_and_short_runs(tmp_path):
    plot_loss_curve(run_rows(with_val=False), tmp_path / "a.png", steps_per_epoch=100, best_step=None)
    assert_png(tmp_path / "a.png")
    plot_loss_curve(run_rows(steps=6, spe=3, eval_every=3), tmp_path / "b.png", steps_per_epoch=3, best_step=3)
    assert_png(tmp_path / "b.png")


def test_tolerates_nan_and_empty(tmp_path):
    rows = run_rows()
    rows[200]["train_loss"] = float("nan")
    plot_loss_curve(rows, tmp_path / "nan.png", steps_per_epoch=100, best_step=999)  # best step not an eval step
    assert_png(tmp_path / "nan.png")
    plot_loss_curve([], tmp_path / "empty.png", steps_per_epoch=100, best_step=None)
    assert (tmp_path / "empty.png").read_bytes()[:8] == PNG_SIGNATURE


def _pixels_of(path, color: str) -> int:
    """How many pixels of the PNG are drawn in `color` (#rrggbb)."""
    import numpy as np
    from matplotlib.image import imread

    image = imread(path)[..., :3]
    target = np.array([int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(image - target).max(axis=-1) < 0.02).sum())


def test_the_forgetting_curve_is_drawn_beside_validation(tmp_path):
    from finetune.report.plot import GENERAL_COLOR, VAL_COLOR

    rows = run_rows()
    plot_loss_curve(rows, tmp_path / "off.png", steps_per_epoch=100, best_step=125)
    assert _pixels_of(tmp_path / "off.png", GENERAL_COLOR) == 0  # without the curve: nothing of its colour
    rows[0]["general_val_loss_base"] = 0.9
    for row in rows:
        if "val_loss" in row:
            row["general_val_loss"] = 0.9 + row["step"] / 600  # drifting away from the base
    plot_loss_curve(rows, tmp_path / "on.png", steps_per_epoch=100, best_step=125)
    assert_png(tmp_path / "on.png")
    assert _pixels_of(tmp_path / "on.png", GENERAL_COLOR) > 500  # the curve, its markers and the base's level
    assert _pixels_of(tmp_path / "on.png", VAL_COLOR) > 200  # validation is still drawn
