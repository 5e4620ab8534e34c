"""Auto's rules for preference tuning (--method dpo): epochs, learning rate and beta, each with its reason.

A preference run starts from a model that already answers (a base or an SFT-tuned one) and only moves
probability between two answers, so it takes fewer passes and smaller steps than supervised tuning:
OpenAI's and TRL's defaults, and the DPO paper's recipes, use 1-3 epochs, a learning rate 5-40x below the
supervised one and beta = 0.1.
"""

from __future__ import annotations

from finetune.rules.auto import Choice

DPO_EPOCHS_BY_PAIRS = ((5_000, 2),)  # (pairs below, epochs); 1 from 5,000 pairs
DPO_LR_FACTOR = 0.1  # x the supervised rate Auto would pick for the same weights, batch and width
DPO_BETA = 0.1


def auto_dpo_epochs(pairs: int) -> Choice[int]:
    epochs = next((e for limit, e in DPO_EPOCHS_BY_PAIRS if pairs < limit), 1)
    why = "a small set gets a second pass" if epochs == 2 else "a set this size needs one pass"
    return Choice(
        epochs,
        f"{pairs} preference pairs: {why}; preference tuning takes 1-2 passes (supervised tuning 1-3), "
        "more makes the model overconfident in the chosen answers",
    )


def auto_dpo_lr(supervised: Choice[float]) -> Choice[float]:
    lr = float(f"{supervised.value * DPO_LR_FACTOR:.2g}")
    return Choice(
        lr,
        f"{DPO_LR_FACTOR:g} x the supervised rate {supervised.value:g} ({supervised.reason}): the DPO loss moves "
        "the log-probability ratio of whole answers, so small steps keep the model close to where it starts",
    )


def auto_beta() -> Choice[float]:
    return Choice(
        DPO_BETA,
        f"{DPO_BETA:g}, the DPO paper's and TRL's default: larger keeps the model closer to the starting model, "
        "smaller lets it move further from it",
    )
