"""Cost: billed tokens x price per million, and an estimated time x device-hour price.

    training FLOPs ~ 6 N T  (full: forward 2NT, backward 4NT)
                   ~ 4 N T  (LoRA: no weight gradients for the frozen base; the adapter's own are negligible)
                   + 2 N T  with gradient checkpointing (one more forward)
    time           = FLOPs / (devices x peak x MFU)
                   = tokens / (devices x measured tokens/s)   when this machine measured this model (train/speed.py)

N = model parameters, T = tokens processed. The token cost is exact when the token count is; the time
and its cost are estimates (assumed utilisation, attention FLOPs left out) and say so (`estimate: true`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from finetune.rules.memory import DeviceSpec
from finetune.settings.wording import ref

GPU_MFU = 0.35  # model FLOPs utilisation a well-fed fine-tuning run reaches on a datacenter GPU
CPU_FLOPS = 1e11  # effective FLOP/s of one CPU training process (fp32): very rough
CALL_S = 0.01  # the fixed cost of one forward call of a batch (Python, kernel launches), whatever the model's size


@dataclass
class CostEstimate:
    """What the run costs, by tokens and by time."""

    billed_tokens: int | None
    """Tokens processed (tokens in the training file x epochs): what a per-token price bills."""
    tokens_exact: bool
    """False when the token count is estimated (no tokenizer, or the run is cut short)."""
    price_per_million_tokens: float | None
    """--price-per-million-tokens."""
    token_cost: float | None
    """billed_tokens / 1e6 x price; None without a price or a token count."""
    device: str
    """The device the time is estimated for."""
    device_assumed: bool
    """True when --gpu was not given and the default device is assumed."""
    devices: int
    """Devices training together (time is divided by them, device-hours multiplied)."""
    flops: float | None
    """Training FLOPs (estimate)."""
    mfu: float | None
    """Assumed model FLOPs utilisation (None on the CPU, where a flat rate is assumed)."""
    seconds: float | None
    """Estimated wall-clock training time."""
    device_hours: float | None
    """seconds / 3600 x devices: what an hourly price bills."""
    gpu_hour_price: float | None
    """--gpu-hour-price, per device-hour."""
    time_cost: float | None
    """device_hours x price; None without a price or a time estimate."""
    tokens_per_s: float | None = None
    """Training tokens per second of one device, measured on this machine with this model; None: not measured."""
    estimate: bool = True
    """The time, FLOPs and time cost are estimates from an assumed throughput, not measurements."""
    notes: list[str] = field(default_factory=list)
    """What the estimate assumes, or why a part is missing."""

    def to_dict(self) -> dict:
        return asdict(self)


def generation_seconds(params: int, forward_tokens: int, calls: int, flops_per_s: float) -> float:
    """Greedy generation (an estimate): 2 x parameters x every token the forward calls read, at `flops_per_s`, plus
    each call's fixed cost (a small model's time is mostly calls, a large one's FLOPs)."""
    return 2 * params * forward_tokens / flops_per_s + calls * CALL_S


def device_flops(device: DeviceSpec) -> float:
    """The FLOP/s one process of `device` is assumed to reach: CPU_FLOPS on a CPU, GPU_MFU of a GPU's peak."""
    return CPU_FLOPS if device.peak_flops is None else device.peak_flops * GPU_MFU


def training_flops(params: int, tokens: int, method: str, gradient_checkpointing: bool = False) -> float:
    """6NT for full fine-tuning, 4NT for LoRA, +2NT when activations are recomputed."""
    factor = 6 if method == "full" else 4
    if gradient_checkpointing:
        factor += 2
    return float(factor) * params * tokens


def estimate_cost(
    tokens_processed: int | None,
    tokens_exact: bool,
    params: int | None,
    method: str,
    device: DeviceSpec,
    device_assumed: bool,
    devices: int = 1,
    gradient_checkpointing: bool = False,
    price_per_million_tokens: float | None = None,
    gpu_hour_price: float | None = None,
    measured_tokens_per_s: float | None = None,
    eval_tokens: int = 0,
    work_tokens: int | None = None,
) -> CostEstimate:
    """Token cost (exact when the tokens are) and time cost (an estimate) of one run.

    With `measured_tokens_per_s` (this machine, this model) the time is tokens / speed, the validation passes
    (`eval_tokens`, forward only: a third of a training token's work) included; otherwise FLOPs / an assumed rate.
    `work_tokens`: the tokens the run trains on when they are more than the billed ones (the product's own replay
    rows): the time and the FLOPs count them, the token cost does not.
    """
    trained = tokens_processed if work_tokens is None else work_tokens
    notes = []
    token_cost = None
    if tokens_processed is None:
        notes.append("tokens unknown (give --tokens or a data file): no token count, cost or time")
    elif price_per_million_tokens is not None:
        token_cost = tokens_processed / 1e6 * price_per_million_tokens
    flops = seconds = hours = time_cost = mfu = None
    if params is None:
        notes.append("model size unknown: no time estimate")
    elif trained is not None:
        flops = training_flops(params, trained, method, gradient_checkpointing)
    if trained is not None and measured_tokens_per_s:
        seconds = (trained + eval_tokens / 3) / (measured_tokens_per_s * devices)
        notes.append(
            f"time from {measured_tokens_per_s:,.0f} training tokens/s measured on this machine with this model"
        )
    elif flops is not None:
        if device.peak_flops is None:
            rate = CPU_FLOPS * devices
            notes.append(f"CPU time assumes about {CPU_FLOPS:.0e} FLOP/s per process: a rough guess")
        else:
            mfu = GPU_MFU
            rate = device.peak_flops * GPU_MFU * devices
            notes.append(
                f"time assumes {GPU_MFU:.0%} of {device.name}'s {device.peak_flops / 1e12:.0f} TFLOP/s bf16 peak"
                + (f" (no {ref('gpu')} given: assumed)" if device_assumed else "")
            )
        seconds = flops / rate
    if seconds is not None:
        hours = seconds / 3600 * devices
        if gpu_hour_price is not None:
            time_cost = hours * gpu_hour_price
    return CostEstimate(
        billed_tokens=tokens_processed,
        tokens_exact=tokens_exact and tokens_processed is not None,
        price_per_million_tokens=price_per_million_tokens,
        token_cost=token_cost,
        device=device.name,
        device_assumed=device_assumed,
        devices=devices,
        flops=flops,
        mfu=mfu,
        seconds=seconds,
        device_hours=hours,
        gpu_hour_price=gpu_hour_price,
        time_cost=time_cost,
        tokens_per_s=measured_tokens_per_s,
        notes=notes,
    )
