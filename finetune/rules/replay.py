"""Auto's rule for self-replay (`replay`): how many general rows to rehearse per team row, or none.

Replay rows are general requests answered by the base model itself (or a team's own general conversations), mixed
into training so tuning keeps rehearsing what the base did on everyday requests (docs/retention.md, "Self-replay").
The share and the size limit are measured on SmolLM2-135M-Instruct with the demo's data (bench/AUTO.md).
"""

from __future__ import annotations

from finetune.rules.auto import Choice

AUTO_RATIO = 0.25  # replay rows per team row: see RATIO_REASON
# Below this a model has no general abilities worth rehearsing: the pretrained toy base (1.25M parameters) answers 3%
# of the retention set right; the smallest published chat models (SmolLM2-135M) have ~100M parameters.
MIN_PARAMETERS = 10_000_000
RATIO_REASON = (
    "1 replay row per 4 team rows: on SmolLM2-135M-Instruct it kept the base's accuracy, rule pass-rate, multiple "
    "choice and the form of longer answers better than 1:1 did (KL 0.26 nats per token, not 0.33), for a quarter of "
    "the extra steps; trained on, never billed (bench/AUTO.md)"
)


def nothing_to_keep(total_params: int | None) -> str | None:
    """Why a model this small has no general abilities for Auto to protect (replay, adapter scale); None otherwise."""
    if total_params is None or total_params >= MIN_PARAMETERS:
        return None
    return (
        f"a model of {total_params / 1e6:.1f}M parameters has no general abilities to keep (below "
        f"{MIN_PARAMETERS // 1_000_000}M; the pretrained toy base answers 3% of the retention set right)"
    )


def auto_replay(total_params: int | None, general_data: bool, objective: str) -> Choice[float]:
    """The replay rows per team row Auto mixes in (0: none), and why."""
    if objective == "dpo":
        return Choice(0.0, "off: preference tuning trains on pairs of answers, replay on supervised answers")
    if general_data:
        return Choice(AUTO_RATIO, f"your general conversations, {RATIO_REASON}")
    if (small := nothing_to_keep(total_params)) is not None:
        return Choice(0.0, f"off: {small}, and its answers would teach noise")
    return Choice(AUTO_RATIO, f"general requests answered by the base model itself, {RATIO_REASON}")
