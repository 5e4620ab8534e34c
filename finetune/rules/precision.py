"""Auto's precision: the one compute precision a run's models use, from the device, the model's width and the CPU.

    choice = auto_dtype("cpu", hidden_size=576, cpu_bf16=native_bf16_cpu())   # Choice("bf16", reason)

bf16 on a GPU (every GPU of the plan's device table computes it natively). On a CPU, bf16 only where it was measured
faster: a CPU with native bf16 matrix instructions (AMX-BF16 or AVX512-BF16) and a model wide enough for its matrix
products to pay for the conversions around them. Measured on this repository's machine (bench/precision.json: a Xeon
with AMX, one LoRA training step of 256 tokens, bf16 as below against fp32, CPU time on one thread): width 128 1.04x
(within the noise), 256 1.27x, 384 1.47x, 512 1.69x, 768 2.0x; SmolLM2-135M (width 576) 1.7x.

What bf16 means, whoever chooses it: the frozen base of a LoRA run is held in bf16, the adapter (and anything else
trained) and AdamW's moments in fp32, the passes under bf16 autocast; full fine-tuning keeps fp32 master weights
and runs its passes under bf16 autocast; generation (replay, the retention check, eval, the demo, serving) loads
the model in bf16. fp32 everywhere otherwise: what the equivalence tests pin with `dtype="fp32"`.

No torch: the CPU's instructions are read from /proc/cpuinfo (Linux); elsewhere the CPU counts as without them.
"""

from __future__ import annotations

import functools
from pathlib import Path

from finetune.rules.auto import Choice

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPU_BF16_MIN_WIDTH = 256  # narrower models run no faster in bf16 on the CPU (measured above): fp32 keeps the numbers


@functools.cache
def native_bf16_cpu() -> bool:
    """Whether this CPU has bf16 matrix instructions (AMX-BF16 or AVX512-BF16)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(flag in flags for flag in CPU_BF16_FLAGS)


def device_type(device_name: str | None) -> str:
    """The torch device type a plan's device names: "cpu", or "cuda" for any GPU."""
    return "cpu" if (device_name or "").strip().lower() == "cpu" else "cuda"


def auto_dtype(device_name: str | None, hidden_size: int | None, cpu_bf16: bool | None = None) -> Choice[str]:
    """bf16 or fp32 for a run on `device_name` (the plan's device) of a model `hidden_size` wide."""
    if device_type(device_name) == "cuda":
        return Choice("bf16", "a GPU computes bf16 natively: weights trained and AdamW's moments stay fp32")
    if cpu_bf16 is None:
        cpu_bf16 = native_bf16_cpu()
    if not cpu_bf16:
        return Choice("fp32", "this CPU has no bf16 matrix instructions (AMX-BF16, AVX512-BF16): fp32 is faster")
    if hidden_size is None:
        return Choice("fp32", "the model's width is unknown: fp32 (bf16 pays on this CPU only for wider models)")
    if hidden_size < CPU_BF16_MIN_WIDTH:
        return Choice(
            "fp32",
            f"a model {hidden_size} wide runs no faster in bf16 on this CPU (it pays from {CPU_BF16_MIN_WIDTH}): fp32",
        )
    return Choice(
        "bf16",
        f"this CPU computes bf16 natively and a model {hidden_size} wide runs faster in it (measured: 1.7x on "
        "SmolLM2-135M); the adapter or master weights and AdamW's moments stay fp32",
    )


def resolve_dtype(setting: str, device_name: str | None, hidden_size: int | None) -> Choice[str]:
    """The setting's value when given ("fp32", "bf16"), else Auto's choice: what every model of the run uses."""
    if setting in ("fp32", "bf16"):
        return Choice(setting, "set for this run")
    return auto_dtype(device_name, hidden_size)
