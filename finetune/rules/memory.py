"""Memory estimate by part (bytes, per device), the named device sizes, and the Auto choices that follow from it.

    weights      every parameter: trainable ones in fp32 (the optimizer's master copy), a frozen LoRA base
                 in the compute precision (bf16 on a GPU, fp32 on the CPU)
    gradients    fp32, trainable parameters only (none for a frozen base)
    optimizer    AdamW keeps two fp32 moments: 8 bytes per trainable parameter
    activations  saved for the backward pass, for one micro-batch of (batch x sequence length) tokens;
                 with gradient checkpointing only each block's input is kept and one block is recomputed
    logits       the output layer's (tokens x vocabulary) logits in fp32 for the loss, with their gradient
    overhead     CUDA context and workspaces (fixed 1 GiB on a GPU)

With FSDP (`shard` = full) weights, gradients and optimizer are divided across devices.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from finetune.rules.auto import Choice
from finetune.rules.model_facts import ModelFacts

GIB = 1024**3
MIB = 1024**2
GPU_OVERHEAD = 1 * GIB
ADAMW_BYTES = 8  # two fp32 moments per trainable weight
FP32 = 4
LOGIT_BYTES = 12  # compute-precision logits upcast to fp32 for the loss (4) + their fp32 gradient (4) + slack


@dataclass(frozen=True)
class DeviceSpec:
    """A named device size: memory as nvidia-smi reports it, and dense bf16 peak for the time estimate."""

    name: str
    memory_bytes: int | None
    """Total memory; None for the CPU (system memory is not known to the plan)."""
    peak_flops: float | None
    """Dense bf16 tensor-core peak, FLOP/s (the vendor's datasheet figure without sparsity)."""


DEVICES: dict[str, DeviceSpec] = {
    "l4-24gb": DeviceSpec("l4-24gb", 23034 * MIB, 121e12),
    "a100-40gb": DeviceSpec("a100-40gb", 40960 * MIB, 312e12),
    "a100-80gb": DeviceSpec("a100-80gb", 81920 * MIB, 312e12),
    "h100-80gb": DeviceSpec("h100-80gb", 81559 * MIB, 989e12),
    "h200-141gb": DeviceSpec("h200-141gb", 143771 * MIB, 989e12),
    "cpu": DeviceSpec("cpu", None, None),
}
DEFAULT_DEVICE = "h100-80gb"  # what the plan sizes against when --gpu is not given


def resolve_device(name: str | None) -> tuple[DeviceSpec, bool, bool]:
    """(device, assumed, recognised): the named device, or DEFAULT_DEVICE when none or an unknown name is given.

    A unique prefix is enough: `h100` -> h100-80gb, `l4` -> l4-24gb.
    """
    if name is None:
        return DEVICES[DEFAULT_DEVICE], True, True
    key = name.strip().lower()
    if key in DEVICES:
        return DEVICES[key], False, True
    matches = [spec for spec_name, spec in DEVICES.items() if spec_name.startswith(key + "-")]
    if len(matches) == 1:
        return matches[0], False, True
    return DEVICES[DEFAULT_DEVICE], True, False


def device_for_name(reported: str, memory_bytes: int) -> str:
    """The table's name for a GPU as the driver reports it ("NVIDIA H100 80GB HBM3" -> h100-80gb); when the table
    does not know it, the closest memory size of the same family, else the reported name itself."""
    words = [w for w in re.split(r"[\s_-]+", reported.lower()) if w and w != "nvidia"]
    family = next((w for w in words if any(name.startswith(w + "-") for name in DEVICES)), None)
    candidates = [spec for name, spec in DEVICES.items() if family and name.startswith(family + "-")]
    if not candidates:
        return "-".join(words) or "gpu"
    return min(candidates, key=lambda spec: abs((spec.memory_bytes or 0) - memory_bytes)).name


@dataclass
class MemoryEstimate:
    """Peak training memory on one device, in bytes, by part."""

    known: bool
    """False when the model's size is unknown: every byte count is then None."""
    parameters: int | None = None
    """Every parameter of the model."""
    trainable_parameters: int | None = None
    """Parameters the optimizer updates (all for full fine-tuning, the adapter for LoRA)."""
    weights: int | None = None
    """Every parameter: trainable ones in fp32, a frozen LoRA base in the compute precision."""
    gradients: int | None = None
    """fp32 gradients of the trainable parameters."""
    optimizer: int | None = None
    """AdamW's two fp32 moments: 8 bytes per trainable parameter."""
    activations: int | None = None
    """Saved activations with the chosen gradient-checkpointing setting (logits included)."""
    activations_without_checkpointing: int | None = None
    activations_with_checkpointing: int | None = None
    overhead: int | None = None
    """CUDA context and workspaces (0 on the CPU)."""
    total: int | None = None
    """Sum of the parts with the chosen setting: the peak to compare with a device's memory."""
    gradient_checkpointing: bool = False
    """The setting `activations` and `total` are computed with."""
    sharded: bool = False
    """True when weights, gradients and optimizer are split across devices (FSDP)."""
    devices: int = 1
    """Devices training together."""
    micro_batch_tokens: int | None = None
    """Tokens of one micro-batch (batch x longest sequence): the worst case the activations are sized for."""
    compute_dtype: str = "bf16"
    """Precision of the forward/backward pass (bf16 on a GPU, fp32 on the CPU unless --dtype says otherwise)."""
    device: str | None = None
    """The device the plan is sized against."""
    device_assumed: bool = True
    """True when --gpu was not given (or not recognised) and the default device is assumed."""
    device_bytes: int | None = None
    """Memory of `device`; None for the CPU."""
    fits_device: bool | None = None
    """Whether `total` fits `device`; None when unknown (CPU, or model size unknown)."""
    fits: list[str] = field(default_factory=list)
    """Named device sizes the total fits on, smallest first."""
    source: str | None = None
    """Where the model's numbers come from."""
    estimate: bool = True
    """Always True: these are estimates, not measurements."""

    def to_dict(self) -> dict:
        return asdict(self)


def activation_bytes_per_token(model: ModelFacts, rank: int | None) -> int:
    """The estimate's activations of one token in fp32, without gradient checkpointing."""
    return _activation_bytes(model, 1, FP32, rank)[0]


def _activation_bytes(model: ModelFacts, tokens: int, dtype_bytes: int, rank: int | None) -> tuple[int, int]:
    """(without, with) gradient checkpointing, for `tokens` tokens in one micro-batch."""
    h, i = model.hidden_size, model.intermediate_size
    # per token per block: norms in/out (4h), q/k/v and rotated q/k and attention output (3q + 3kv),
    # gated MLP (gate, up, act(gate), act*up = 4i); a LoRA adds its rank-r intermediates on 7 linears
    per_block = 4 * h + 3 * model.q_dim + 3 * model.kv_dim + 4 * i + (7 * rank if rank else 0)
    logits = tokens * model.vocab_size * LOGIT_BYTES
    embeddings = tokens * h * dtype_bytes
    without = tokens * model.num_layers * per_block * dtype_bytes + logits + embeddings
    # checkpointing keeps each block's input and recomputes one block at a time
    with_ckpt = tokens * model.num_layers * h * dtype_bytes + tokens * per_block * dtype_bytes + logits + embeddings
    return without, with_ckpt


def estimate_memory(
    model: ModelFacts | None,
    method: str,
    micro_batch: int,
    seq_len: int,
    gradient_checkpointing: bool,
    lora_rank: int | None = None,
    devices: int = 1,
    shard: str = "none",
    device: DeviceSpec | None = None,
    device_assumed: bool = True,
    compute_dtype: str = "bf16",
    lora_train_head: bool = False,
) -> MemoryEstimate:
    """Peak memory per device for one configuration; a LoRA estimate is for the adapter of `lora_rank` (the plan's
    rank, or the rank a caller sizes for: it is never assumed here)."""
    device = device or DEVICES[DEFAULT_DEVICE]
    if model is None:
        return MemoryEstimate(
            known=False, device=device.name, device_assumed=device_assumed, compute_dtype=compute_dtype
        )
    dtype_bytes = 2 if compute_dtype == "bf16" else FP32
    params = model.total_params
    if method == "lora":
        if lora_rank is None:
            raise ValueError("a LoRA memory estimate needs the adapter's rank")
        rank = lora_rank
        trainable = model.lora_params(rank) + (model.head_params if lora_train_head else 0)
        weights = params * dtype_bytes + trainable * FP32  # frozen base in compute precision, adapter in fp32
    else:
        rank = None
        trainable = params
        weights = params * FP32
    gradients = trainable * FP32
    optimizer = trainable * ADAMW_BYTES
    sharded = shard == "full" and devices > 1
    if sharded:
        weights, gradients, optimizer = (-(-x // devices) for x in (weights, gradients, optimizer))
    tokens = micro_batch * seq_len
    act_without, act_with = _activation_bytes(model, tokens, dtype_bytes, rank)
    activations = act_with if gradient_checkpointing else act_without
    overhead = GPU_OVERHEAD if device.memory_bytes is not None else 0
    total = weights + gradients + optimizer + activations + overhead
    sizes = sorted((s for s in DEVICES.values() if s.memory_bytes is not None), key=lambda s: s.memory_bytes or 0)
    return MemoryEstimate(
        known=True,
        parameters=params,
        trainable_parameters=trainable,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        activations_without_checkpointing=act_without,
        activations_with_checkpointing=act_with,
        overhead=overhead,
        total=total,
        gradient_checkpointing=gradient_checkpointing,
        sharded=sharded,
        devices=devices,
        micro_batch_tokens=tokens,
        compute_dtype=compute_dtype,
        device=device.name,
        device_assumed=device_assumed,
        device_bytes=device.memory_bytes,
        fits_device=None if device.memory_bytes is None else total <= device.memory_bytes,
        fits=[s.name for s in sizes if total - overhead + GPU_OVERHEAD <= (s.memory_bytes or 0)],
        source=model.source,
    )


# ----------------------------------------------------------------------------- Auto decisions from memory


def decide_shard(
    method: str, devices: int, full_replica: MemoryEstimate | None, device_name: str | None = None
) -> Choice[str]:
    """FSDP (`full`) only for full fine-tuning that does not fit one device; otherwise replicate (DDP, `none`)."""
    if devices == 1:
        return Choice("none", "one device: nothing to shard")
    if method == "lora":
        return Choice("none", "LoRA: the frozen model fits where it is replicated and the adapter is small (DDP)")
    if full_replica is None or not full_replica.known:
        return Choice("none", "model size unknown: replicate the model on every device (DDP)")
    if full_replica.fits_device is False:
        return Choice(
            "full",
            f"a full copy with its gradients and AdamW moments needs {gib(full_replica.total)} per device, more "
            f"than {device_name or full_replica.device}: shard it across the {devices} devices (FSDP)",
        )
    return Choice("none", f"a full copy fits {device_name or full_replica.device} ({gib(full_replica.total)}): DDP")


def decide_gradient_checkpointing(without: MemoryEstimate, with_ckpt: MemoryEstimate) -> Choice[bool]:
    """Off when the micro-batch fits without it (it costs ~1/3 more compute); on when it is what makes it fit."""
    if not without.known:
        return Choice(False, "model size unknown: off (turn it on if the run runs out of memory)")
    if without.fits_device is None:
        return Choice(False, f"sized for {without.device}: off (no device memory limit to respect)")
    if without.fits_device:
        return Choice(False, f"fits {without.device} without it ({gib(without.total)}): off, saving the recomputation")
    if with_ckpt.fits_device:
        return Choice(
            True,
            f"needs {gib(without.total)} without it, more than {without.device}; {gib(with_ckpt.total)} with it",
        )
    return Choice(True, f"does not fit {without.device} even with it ({gib(with_ckpt.total)}): on, to need the least")


def gib(value: int | None) -> str:
    """Bytes as a short human string: 12.3 GiB, 512 MiB."""
    if value is None:
        return "unknown"
    if value >= GIB:
        return f"{value / GIB:.1f} GiB"
    if value >= MIB:
        return f"{value / MIB:.0f} MiB"
    return f"{value / 1024:.0f} KiB"
