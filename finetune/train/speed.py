"""How fast this machine trains this model: a finished run's own steps, or a few timed micro-steps, cached.

    tokens_per_s = cached_speed(model, "lora", seq_len, "cpu")          # no torch import; None when not known
    tokens_per_s = training_speed(model, "lora", seq_len, device)      # measured once when not known (loads the model)

The plan's time estimate divides the tokens a run processes by this speed. Without it the plan can only guess
a CPU's throughput (one number for every CPU) or assume a share of a GPU's datasheet peak; with it the estimate
is what this machine did with this model, method and sequence length, on an earlier run or seconds ago.

A finished single-device run records its own steps' median speed (`remember_run_speed`): `finetune train` does not
measure before it trains (that would load the model a second time), so its first plan shows the guess, and every
later plan the speed its runs had. `finetune plan` loads no model (it reads what is known, else the guess);
`training_speed` (a caller that asks `plan_run(measure=True)`) measures: the median of a few forward + backward +
AdamW steps on one micro-batch of random tokens of the planned length, with the weights the run trains (LoRA, or
all), after one warm-up step.

The cache (speed.json in the finetune cache folder) is keyed by the machine (CPU model, cores, threads, torch's
version, the device kind as the plan's device table names it), the model's identity (fingerprint.model_identity:
its path and weight headers), the method, and the sequence length (a power of two near the run's). The key is read
without importing torch, so a process that only plans (the service's worker) reads it too. Safe to delete.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.models.facts import load_model_facts
from finetune.placement.where import Placement
from finetune.report.metrics import read_metrics
from finetune.rules.memory import device_for_name, resolve_device
from finetune.rules.precision import resolve_dtype
from finetune.settings import caches
from finetune.settings.fingerprint import model_identity

if TYPE_CHECKING:
    import torch

TIMED_STEPS = 2
ROWS = 1  # rows of one timed micro-batch
MAX_LENGTH = 512
LORA_RANK = 16  # the adapter's rank barely changes a step's time: one measurement serves every rank
# what a GPU driver leaves on Linux (NVIDIA, AMD's ROCm, WSL2): without any, torch finds no GPU either
GPU_DRIVER_FILES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def cache_file() -> Path:
    return caches.root() / "speed.json"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def torch_device() -> torch.device:
    """The device a single process of this machine trains on."""
    import torch  # torch: only a process that trains or measures asks

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def no_gpu_here() -> bool:
    """Certain without torch that this machine has no GPU torch could train on (macOS: torch_device never picks MPS)."""
    if sys.platform == "darwin":
        return True
    return sys.platform == "linux" and not any(os.path.exists(path) for path in GPU_DRIVER_FILES)


def local_device_kind(device: torch.device | None = None) -> str:
    """The device this process trains on, as the plan's device table names it ("cpu" without a GPU). Without a
    `device` on a machine with no GPU driver, "cpu" is known without importing torch."""
    if device is None and no_gpu_here():
        return "cpu"
    device = device or torch_device()
    if device.type != "cuda":
        return "cpu"
    import torch  # torch: a CUDA device is named by its driver

    return device_for_name(torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory)


def device_kind_of(gpu: str | None) -> str:
    """The device kind a plan's `gpu` setting names, as speeds are kept by (the table's name, or the name given)."""
    spec, _, recognised = resolve_device(gpu)
    return spec.name if recognised or gpu is None else gpu.strip().lower()


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")  # the installed version, without importing it
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _threads() -> str:
    """The CPU threads a process may use: OMP_NUM_THREADS (the launcher sets it per process), else the CPUs it may
    run on."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return os.environ.get("OMP_NUM_THREADS") or str(available)


def machine_key(device_kind: str) -> str:
    """This machine training on `device_kind` ("cpu", "h100-80gb"), as its speeds are kept by."""
    return f"{_cpu_name()}|{os.cpu_count()} cores|{_threads()} threads|torch {_torch_version()}|{device_kind}"


def speed_method(trained_weights: str, dtype: str) -> str:
    """The method a speed is kept by: the trained weights, and the precision when it is not fp32 ("lora@bf16"); the
    same method in bf16 and in fp32 are two speeds (rules/precision.py)."""
    return trained_weights if dtype == "fp32" else f"{trained_weights}@{dtype}"


def speed_key(model: str, trained_weights: str, seq_len: int) -> str:
    """What a measurement is of, whatever the machine: the model's identity, the method, the measured length."""
    identity = model_identity(model)
    return f"{identity.get('sha256') or identity['name']}|{trained_weights}|{measured_length(seq_len)}"


def _key(model: str, trained_weights: str, seq_len: int, device_kind: str) -> str:
    return f"{machine_key(device_kind)}|{speed_key(model, trained_weights, seq_len)}"


def speeds_measured_here(device: str | torch.device | None = None) -> dict[str, float]:
    """Every speed this machine has for a device (a kind, a torch device, or None: this machine's), by `speed_key`:
    what a service worker reports when it registers. A kind or, on a machine without a GPU, None: no torch import."""
    kind = device if isinstance(device, str) else local_device_kind(device)
    prefix = machine_key(kind) + "|"
    return {k[len(prefix) :]: float(v["tokens_per_s"]) for k, v in _read().items() if k.startswith(prefix)}


def measured_length(seq_len: int) -> int:
    """The sequence length a measurement uses: a power of two near the run's, at most 512 (time per token hardly
    changes beyond; a measurement must stay a few seconds)."""
    return min(MAX_LENGTH, 1 << max(6, (max(1, seq_len) - 1).bit_length()))


def _read() -> dict:
    try:
        return json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _write(key: str, tokens_per_s: float) -> None:
    with contextlib.suppress(OSError):
        path = cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        known = _read() | {key: {"tokens_per_s": tokens_per_s, "measured_at": int(time.time())}}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1), encoding="utf-8")
        os.replace(tmp, path)


def cached_speed(model: str, trained_weights: str, seq_len: int, device_kind: str) -> float | None:
    """What this machine knows of training `model` on `device_kind`, or None (nothing is measured; no torch import)."""
    entry = _read().get(_key(model, trained_weights, measured_length(seq_len), device_kind))
    return float(entry["tokens_per_s"]) if entry else None


def training_speed(
    model: str, trained_weights: str, seq_len: int, device: torch.device, trust_remote_code: bool = False
) -> float | None:
    """Training tokens per second of one process on `device`, cached or measured (once per machine and model: the
    model is loaded for it)."""
    kind = local_device_kind(device)
    if (known := cached_speed(model, trained_weights, seq_len, kind)) is not None:
        return known
    length = measured_length(seq_len)
    try:
        measured = _measure(model, trained_weights, length, device, trust_remote_code)
    except Exception:  # a model we cannot run this way: the plan keeps its FLOP-based guess, and says so
        return None
    _write(_key(model, trained_weights, length, kind), measured)
    return measured


def remember_run_speed(model: str, trained_weights: str, seq_len: int, device_kind: str, tokens_per_s: float) -> None:
    """A finished run's own speed (tokens/s of its steps) replaces what was known of its model, method and length on
    this machine: the next plan is estimated from what a real run did. A few timed micro-steps taken while the
    machine was busy would otherwise stay in the cache (a SmolLM2 plan once said 11.7 h for a 14 min run)."""
    _write(_key(model, trained_weights, measured_length(seq_len), device_kind), tokens_per_s)


def _measure(
    model_name: str, trained_weights: str, seq_len: int, device: torch.device, trust_remote_code: bool
) -> float:
    import torch  # torch: only a measurement runs the model

    from finetune.train.model import add_lora, load_model, trainable_parameters, trained_in_fp32  # torch: as above

    method, _, dtype = trained_weights.partition("@")
    placement = Placement(str(device), dtype or "fp32")
    model = load_model(model_name, placement.weights_dtype(method), trust_remote_code)
    if method == "lora":
        model = add_lora(model, LORA_RANK, 2.0 * LORA_RANK, 0.0, 0)
        trained_in_fp32(model, placement.autocast)
    model.to(device).train()
    params = [p for _, p in trainable_parameters(model)]
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=True)
    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (ROWS, seq_len), generator=generator).to(device)
    times = []
    for step in range(TIMED_STEPS + 1):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=placement.autocast):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step:  # the first one warms the kernels and the allocator up
            times.append(time.perf_counter() - start)
    return ROWS * seq_len / statistics.median(times)


# ---------------------------------------------------------------------------- a run's speed, planned and remembered


def planned_speed(config, summary, device, measure: bool, speed_of) -> float | None:
    """Training tokens/s with this model on the device the run will train on: `speed_of`'s, or what this machine
    knows of that device (a finished run's speed, or a measurement); `measure`: measure when nothing is known
    and the plan is for this machine's `device` (None: found here)."""
    seq_len = speed_length(summary)
    facts = load_model_facts(config.model)
    dtype = resolve_dtype(config.dtype, config.gpu, facts.hidden_size if facts else None).value  # as the plan will
    method = speed_method(config.trained_weights, dtype)
    if speed_of is not None:
        return speed_of(config.model, method, seq_len)
    kind = device_kind_of(config.gpu)  # a what-if for a device this machine never trained on: nothing is known
    known = cached_speed(config.model, method, seq_len, kind)
    if known is not None or not measure or kind != local_device_kind(device):
        return known
    return training_speed(config.model, method, seq_len, device or torch_device(), config.trust_remote_code)


def speed_length(summary) -> int:
    """The length a speed is known by: the longest record as it will train."""
    return summary.max_record_tokens or summary.max_seq_len or 1024


def remember_speed(out: Path, plan, summary, device) -> None:
    """The median speed of a finished run's steps becomes this machine's speed for the model (one device: a rank of a
    many-device run shares the machine, so its speed is not one device's)."""
    speeds = [row["tokens_per_s"] for row in read_metrics(out / "metrics.jsonl") if row.get("tokens_per_s")]
    if plan.devices == 1 and len(speeds) >= 3:  # the first steps warm up: a median of a few says more
        speed, kind = statistics.median(speeds), local_device_kind(device)
        method = speed_method(plan.run.trained_weights, plan.dtype if plan.dtype in ("fp32", "bf16") else "fp32")
        remember_run_speed(plan.run.model, method, speed_length(summary), kind, speed)
