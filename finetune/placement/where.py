"""A run's placement: the one device and precision every model of the run is loaded in, placed on and run with.

    placement = of_plan(plan, ctx.device)      # training: the plan's precision on this process's device
    placement = of_run("runs/one")             # after training (eval, retention, the demo): what plan.json recorded
    placement = of_config(config, facts)       # before the plan exists (replay's answers): the same rule the plan uses
    placement = for_model("path/to/model")     # outside a run (serving, `finetune eval FILE`): Auto's rule here

The plan chooses them once (plan/build.py `_precision`, rules/precision.py) and records them in plan.json (`device`,
`dtype`); each loader takes a Placement. A device this machine lacks (a run trained on a GPU, evaluated on a laptop)
falls back to the CPU, and bf16 on a GPU without it to fp32, each saying so in the log.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.models.facts import load_model_facts
from finetune.rules.precision import device_type, resolve_dtype

if TYPE_CHECKING:
    import torch

log = logging.getLogger("finetune")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Placement:
    """Where a model runs ("cpu", "cuda", "cuda:1") and in which precision ("fp32" or "bf16")."""

    device: str = "cpu"
    dtype: str = "fp32"

    @property
    def torch_device(self) -> torch.device:
        import torch  # torch: a placement is read without it (plans, run folders)

        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch  # torch: as above

        return torch.bfloat16 if self.dtype == "bf16" else torch.float32

    @property
    def autocast(self) -> bool:
        """Whether the passes run under bf16 autocast (a trained fp32 weight meets the bf16 ones there)."""
        return self.dtype == "bf16"

    def weights_dtype(self, method: str | None = None) -> torch.dtype:
        """The precision the weights are loaded in: full fine-tuning keeps fp32 master weights (its passes run under
        autocast); a LoRA run's frozen base and every model that only generates or scores, the run's precision."""
        import torch  # torch: as above

        return torch.float32 if method == "full" else self.torch_dtype

    def cache_key(self) -> dict:
        """What a cache of generated answers is keyed on besides the model: the device kind, the precision and the
        versions of torch and transformers (each can change a greedy answer)."""
        return {"device": device_type(self.device), "dtype": self.dtype, **_versions()}

    def to_dict(self) -> dict:
        return {"device": self.device, "dtype": self.dtype}


def _versions() -> dict:
    found = {}
    for package in ("torch", "transformers"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def available(wanted: Placement) -> Placement:
    """`wanted` as this machine can run it: a GPU placement without a GPU runs on the CPU, bf16 on a GPU that lacks
    it in fp32; each fallback is logged."""
    import torch  # torch: placing a model needs it

    device, dtype = wanted.device, wanted.dtype
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("the run is placed on %s but this machine has no GPU: its models run on the CPU", device)
        device = "cpu"
    if device.startswith("cuda") and dtype == "bf16" and not torch.cuda.is_bf16_supported():
        log.warning("this GPU does not compute bf16: its models run in fp32")
        dtype = "fp32"
    return Placement(device, dtype)


def of_plan(plan, device: torch.device | str | None = None) -> Placement:
    """The plan's precision on `device` (this process's, when training), else on the plan's device."""
    planned = plan.device or device_type(plan.run.gpu)
    # a plan that left its precision "auto" (made before plans resolved it) ran under the rule of its time
    dtype = plan.dtype if plan.dtype in PRECISIONS else ("bf16" if planned == "cuda" else "fp32")
    return available(Placement(str(device) if device is not None else planned, dtype))


def of_config(config, facts=None) -> Placement:
    """Before the plan exists (its generation ahead of planning): the device and precision the plan will choose."""
    facts = facts if facts is not None else load_model_facts(config.model)
    choice = resolve_dtype(config.dtype, config.gpu, facts.hidden_size if facts else None)
    return available(Placement(device_type(config.gpu), choice.value))


def of_run(run: str | Path) -> Placement:
    """The placement a run's plan.json recorded; a run planned before placements were recorded ran in fp32."""
    try:
        plan = json.loads((Path(run) / "plan.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        plan = {}
    dtype = plan.get("dtype")
    device = plan.get("device") or "cpu"
    return available(Placement(device, dtype if dtype in PRECISIONS else "fp32"))


def for_model(name: str, dtype: str = "auto", device: str | None = None) -> Placement:
    """Outside a run (serving, `finetune eval FILE --model`): this machine's device, and `dtype` or Auto's rule for
    this model on it."""
    import torch  # torch: the device is this machine's

    where = device or ("cuda" if torch.cuda.is_available() else "cpu")
    facts = load_model_facts(name) if dtype not in PRECISIONS else None
    choice = resolve_dtype(dtype, device_type(where), facts.hidden_size if facts else None)
    return available(Placement(where, choice.value))


def where(model) -> dict:
    """Where a loaded model's weights actually are: its devices and, per precision, how many parameters."""
    devices, dtypes = set(), {}
    for parameter in model.parameters():
        devices.add(str(parameter.device))
        name = str(parameter.dtype).removeprefix("torch.")
        dtypes[name] = dtypes.get(name, 0) + parameter.numel()
    return {"devices": sorted(devices), "dtypes": dtypes}
