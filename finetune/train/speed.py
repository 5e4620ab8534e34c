"""How fast this machine trains this model: a few timed micro-steps, measured once and cached.

    tokens_per_s = training_speed(model, "lora", seq_len, device)   # None when it cannot be measured

The plan's time estimate divides the tokens a run processes by this speed. Without it the plan can only guess
a CPU's throughput (one number for every CPU) or assume a share of a GPU's datasheet peak; with it the estimate
is what this machine did with this model, method and sequence length, seconds ago or on an earlier run.

A measurement is the median of a few forward + backward + AdamW steps on one micro-batch of random tokens of
the planned length, with the weights the run trains (LoRA of the planned rank, or all), after one warm-up step.
A finished single-device run replaces the measurement with its own steps' median speed (`remember_run_speed`).
The cache (speed.json in the finetune cache folder) is keyed by the machine (CPU model, cores, threads, torch
version, device), the model's identity (fingerprint.model_identity: its path and weight headers), the method,
and the sequence length (a power of two near the run's); it is safe to delete.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from finetune.settings import caches
from finetune.settings.fingerprint import model_identity

TIMED_STEPS = 2
ROWS = 1  # rows of one timed micro-batch
MAX_LENGTH = 512
LORA_RANK = 16  # the adapter's rank barely changes a step's time: one measurement serves every rank


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
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def local_device_kind(device: torch.device | None = None) -> str:
    """The device this process trains on, as the plan's device table names it ("cpu" without a GPU)."""
    device = device or torch_device()
    if device.type != "cuda":
        return "cpu"
    from finetune.rules.memory import device_for_name

    return device_for_name(torch.cuda.get_device_name(device), torch.cuda.get_device_properties(device).total_memory)


def machine_key(device: torch.device) -> str:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{_cpu_name()}|{os.cpu_count()} cores|{torch.get_num_threads()} threads|torch {torch.__version__}|{gpu}"


def speed_key(model: str, trained_weights: str, seq_len: int) -> str:
    """What a measurement is of, whatever the machine: the model's identity, the method, the measured length."""
    identity = model_identity(model)
    return f"{identity.get('sha256') or identity['name']}|{trained_weights}|{measured_length(seq_len)}"


def _key(model: str, trained_weights: str, seq_len: int, device: torch.device) -> str:
    return f"{machine_key(device)}|{speed_key(model, trained_weights, seq_len)}"


def speeds_measured_here(device: torch.device) -> dict[str, float]:
    """Every speed this machine measured, by `speed_key` (what a service worker reports when it registers)."""
    prefix = machine_key(device) + "|"
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


def cached_speed(model: str, trained_weights: str, seq_len: int, device: torch.device) -> float | None:
    """The cached measurement, or None (nothing is measured here)."""
    entry = _read().get(_key(model, trained_weights, measured_length(seq_len), device))
    return float(entry["tokens_per_s"]) if entry else None


def training_speed(
    model: str, trained_weights: str, seq_len: int, device: torch.device, trust_remote_code: bool = False
) -> float | None:
    """Training tokens per second of one process on `device`, measured (once per machine and model) or cached."""
    if (known := cached_speed(model, trained_weights, seq_len, device)) is not None:
        return known
    length = measured_length(seq_len)
    try:
        measured = _measure(model, trained_weights, length, device, trust_remote_code)
    except Exception:  # a model we cannot run this way: the plan keeps its FLOP-based guess, and says so
        return None
    _write(_key(model, trained_weights, length, device), measured)
    return measured


def remember_run_speed(
    model: str, trained_weights: str, seq_len: int, device: torch.device, tokens_per_s: float
) -> None:
    """A finished run's own speed (tokens/s of its steps) replaces the cached measurement of its model, method and
    length on this machine: the next plan is estimated from what a real run did. A few timed micro-steps taken
    while the machine was busy would otherwise stay in the cache (a SmolLM2 plan once said 11.7 h for a 14 min run)."""
    _write(_key(model, trained_weights, measured_length(seq_len), device), tokens_per_s)


def _measure(
    model_name: str, trained_weights: str, seq_len: int, device: torch.device, trust_remote_code: bool
) -> float:
    from finetune.train.model import add_lora, load_model, trainable_parameters

    model = load_model(model_name, torch.float32, trust_remote_code)
    if trained_weights == "lora":
        model = add_lora(model, LORA_RANK, 2.0 * LORA_RANK, 0.0, 0)
    model.to(device).train()
    params = [p for _, p in trainable_parameters(model)]
    optimizer = torch.optim.AdamW(params, lr=1e-6, fused=True)
    vocab = model.get_input_embeddings().num_embeddings
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (ROWS, seq_len), generator=generator).to(device)
    times = []
    for step in range(TIMED_STEPS + 1):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step:  # the first one warms the kernels and the allocator up
            times.append(time.perf_counter() - start)
    return ROWS * seq_len / statistics.median(times)
