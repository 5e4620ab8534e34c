"""One process per device on torch.distributed (launched by torchrun): NCCL on GPUs, gloo on CPUs.

Every rank computes the same step composition from the seed, so every rank knows the global number
of target tokens of a step without communicating. Gradients are summed across ranks once per
optimizer step (after accumulation); since each rank's loss is already divided by the global target
count, the sum is exactly the single-process gradient.

Two ways to hold the model:
- replicated (`--shard none`, DDP's math): every rank keeps the whole model and optimizer; one flat
  all-reduce per step sums the gradients (`all_reduce_gradients`).
- sharded (`--shard full`, FSDP2 `fully_shard`): each decoder layer, and the rest of the model, is split
  across ranks and gathered only while it computes; gradients are reduce-scattered (summed, not averaged)
  after the step's last micro-batch. Checkpoints hold the full, gathered state (written by rank 0), so they
  load into any number of processes.

A failure on one rank is written for the launcher (`rank_failures`), so the user reads that rank's message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from finetune.settings.errors import UserError
from finetune.settings.wording import ref
from finetune.train.order import micro_batches, pass_tokens, passes
from finetune.train.unwrap import causal_lm

# objective.py (and transformers with it) is imported where it is used: the launcher imports this module only to
# know whether it runs under torchrun
if TYPE_CHECKING:
    from finetune.train.batching import Batch
    from finetune.train.objective import Objective

TIMEOUT_ENV = "FINETUNE_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 600  # rank 0 writing a big checkpoint is the longest wait the others have at a barrier


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


class RankFailed(UserError):
    """An unexpected exception on one rank of several, reduced to one line that names the rank."""


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def collective_timeout() -> timedelta:
    """How long a rank waits in a collective for the others before failing (never forever)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise UserError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    return timedelta(seconds=seconds)


def init_distributed() -> DistContext:
    """Single process unless launched by torchrun; then join the process group."""
    if not launched_by_torchrun():
        return DistContext(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=collective_timeout())
    return DistContext(rank, world, local_rank, device)


# ----------------------------------------------------------------------------- collectives


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def all_reduce_gradients(params: list[torch.nn.Parameter], ctx: DistContext) -> None:
    """Sum gradients across ranks in one flat buffer (a rank with no micro-batch contributes zeros)."""
    if not ctx.distributed:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def agree_on_stop(signum: int | None, ctx: DistContext) -> int | None:
    """The stop signal any rank received: every rank must stop (and checkpoint) after the same step."""
    if not ctx.distributed:
        return signum
    flag = torch.tensor([signum or 0], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag) or None


def gather_objects(obj, ctx: DistContext) -> list | None:
    """Every rank's `obj` on rank 0 (in rank order); None on the other ranks."""
    if not ctx.distributed:
        return [obj]
    gathered = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def shutdown(ctx: DistContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- FSDP (--shard full)


class _LossRoot(torch.nn.Module):
    """FSDP's root unit. The chunked loss reads the LM head's weight directly, outside any forward of the
    model (cross_entropy.py); running the objective's loss inside this module's forward makes FSDP gather the
    embeddings, final norm and head before it, and reduce-scatter their gradients after the backward, like
    any other unit."""

    def __init__(self, model: torch.nn.Module, objective: Objective) -> None:
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.objective.loss(self.model, batch)


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's repeated blocks: the classes transformers never splits across devices."""
    lm = causal_lm(model)
    names = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [m for m in lm.modules() if type(m).__name__ in names]
    if not layers:
        raise UserError(f"cannot find the decoder layers of {type(lm).__name__} to shard; use {ref('shard', 'none')}")
    return layers


def shard_model(model, objective: Objective, ctx: DistContext) -> torch.nn.Module:
    """fully_shard each decoder layer, then the rest; returns the root, whose forward(batch) is the objective's loss.

    The model may still be on the CPU: fully_shard moves each unit to the device as it shards it, so the
    device never holds the whole model.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for layer in reversed(decoder_layers(model)):  # inner units before the units holding them, as FSDP requires
        fully_shard(layer, mesh=mesh)
    root = fully_shard(_LossRoot(model, objective), mesh=mesh)
    for unit in root.modules():
        if isinstance(unit, FSDPModule):
            # each rank's loss is already divided by the step's global target count: sum the ranks'
            # gradients (as all_reduce_gradients does) rather than FSDP's default average; plain SUM also
            # runs on gloo, which has neither AVG nor PREMUL_SUM
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return root


def is_sharded(model) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def local_value(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a DTensor (e.g. the gradient norm FSDP's clipping returns)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def gather_full_state(model, optimizer) -> tuple[dict, dict]:
    """Collective: the full weights and optimizer state, in CPU memory on rank 0 ({} on the other ranks)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def scatter_full_state(model, optimizer, weights: dict, optimizer_state: dict) -> None:
    """Collective: rank 0's full weights and optimizer state into every rank's shards (the others pass {})."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


# ----------------------------------------------------------------------------- the three ways to hold the model


LossFn = Callable[["Batch"], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class Parallelism:
    """How a run holds the model on its processes: a record of plain callables, chosen once (`parallelism`).

    Read with one process in mind, they place the model on the device, hand back the step's micro-batches as
    they are, and reduce nothing. Several processes differ only inside them: DDP sums gradients and numbers
    across ranks; FSDP also makes every rank run as many passes as the busiest one (see `_sharded`).
    """

    wrap: Callable[..., LossFn]
    """wrap(model, objective, filler) -> the function the loop calls on each micro-batch's Batch."""
    micro_batches: Callable[[list[int], list[int]], Iterator[list[int]]]
    """micro_batches(step_examples, lengths) -> this rank's forward/backward passes (example indices) of one
    step: its micro-batches, on a CPU each cut into passes of at most one packed row (`pass_tokens`)."""
    eval_groups: Callable[[list[list]], Iterator[list]]
    """eval_groups(groups) -> this rank's validation groups, as they are run (forward only)."""
    reduce_gradients: Callable[[list[torch.nn.Parameter]], None]
    """After a step's micro-batches: make every rank's gradients the sum over ranks."""
    reduce_sum: Callable[[torch.Tensor], torch.Tensor]
    """A number summed over ranks (in place), e.g. a step's loss."""
    fused_optimizer: bool = True
    """The fused AdamW kernel; sharded (DTensor) parameters keep the default one."""


def _single(ctx: DistContext, plan) -> Parallelism:
    def wrap(model, objective: Objective, filler: Batch | None = None) -> LossFn:
        model.to(ctx.device)
        return partial(objective.loss, model)

    def mine(step_examples: list[int], lengths: list[int]) -> Iterator[list[int]]:
        budget = pass_tokens(plan, ctx.device.type)
        for micro in micro_batches(step_examples, lengths, plan.devices, plan.grad_accum, ctx.rank):
            yield from passes(micro, lengths, budget)

    return Parallelism(
        wrap=wrap,
        micro_batches=mine,
        eval_groups=lambda groups: iter(groups),
        reduce_gradients=lambda params: None,
        reduce_sum=lambda tensor: tensor,
    )


def _replicated(ctx: DistContext, plan) -> Parallelism:
    """Several processes, each with the whole model (DDP's math): one flat all-reduce of the gradients a step."""
    return dataclasses.replace(
        _single(ctx, plan),
        reduce_gradients=partial(all_reduce_gradients, ctx=ctx),
        reduce_sum=partial(all_reduce_sum, ctx=ctx),
    )


def _sharded(ctx: DistContext, plan, bf16: bool) -> Parallelism:
    """FSDP2: each rank holds a shard; parameters are gathered per unit, gradients reduce-scattered (summed).

    FSDP gathers and reduces in every forward and backward, and those collectives must pair up across ranks:
    every rank runs as many passes as the busiest rank (a partial last step, or a rank with fewer validation
    groups, leaves some short). The extra passes run a `filler` batch and score nothing: its loss is
    multiplied by zero before the backward, so it adds no gradient. Only the step's last backward
    reduce-scatters the gradients (`set_requires_gradient_sync`).
    """
    held: dict = {}

    def wrap(model, objective: Objective, filler: Batch | None = None) -> LossFn:
        held["root"] = shard_model(model, objective, ctx)  # moves the model to the device unit by unit, never whole
        held["filler"] = filler.to(ctx.device) if filler is not None else None
        return held["root"]

    def filler_pass(backward: bool) -> None:
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=bf16), torch.set_grad_enabled(backward):
            loss_sum, _ = held["root"](held["filler"])
        if backward:
            (loss_sum * 0.0).backward()

    def mine(step_examples: list[int], lengths: list[int]) -> Iterator[list[int]]:
        per_rank = [
            micro_batches(step_examples, lengths, plan.devices, plan.grad_accum, r) for r in range(ctx.world_size)
        ]
        own, runs = per_rank[ctx.rank], max(len(groups) for groups in per_rank)
        for j in range(runs):
            held["root"].set_requires_gradient_sync(j == runs - 1)
            if j < len(own):
                yield own[j]
            else:
                filler_pass(backward=True)

    def groups_run(groups: list[list]) -> Iterator[list]:
        runs = int(all_reduce_max(torch.tensor(len(groups)), ctx))
        yield from groups
        for _ in range(runs - len(groups)):
            filler_pass(backward=False)

    return Parallelism(
        wrap=wrap,
        micro_batches=mine,
        eval_groups=groups_run,
        reduce_gradients=lambda params: None,  # FSDP reduce-scattered them in the step's last backward
        reduce_sum=partial(all_reduce_sum, ctx=ctx),
        fused_optimizer=False,
    )


def parallelism(plan, ctx: DistContext, bf16: bool = False) -> Parallelism:
    """The way this run holds the model, chosen once from the plan's `shard` and the process count."""
    if not ctx.distributed:
        return _single(ctx, plan)
    return _sharded(ctx, plan, bf16) if plan.shard == "full" else _replicated(ctx, plan)


# ----------------------------------------------------------------------------- failures


PEER_LOST = ("Connection closed by peer", "Connection reset by peer")  # gloo's words when another rank died


def _lost_contact(exc: BaseException) -> bool:
    return isinstance(exc, dist.DistError) or any(words in str(exc) for words in PEER_LOST)


def _describe(exc: BaseException) -> str:
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    text = f"{type(exc).__name__}: {first_line}"
    if _lost_contact(exc):
        return f"lost contact with the other ranks, most likely because one of them failed first ({text[:160]})"
    return text


def record_failure(message: str, rank: int, user_error: bool, lost_contact: bool = False) -> None:
    """Write torchelastic's error file (TORCHELASTIC_ERROR_FILE, set by torchrun for each worker).

    torchrun shows its `message` as the run's root cause; launch.py reads the `finetune` part, whose
    sub-second time tells which rank failed first (torchelastic's own timestamp has whole seconds only).
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    now = time.time()
    detail = message if user_error else traceback.format_exc()
    data = {
        "message": {"message": message, "extraInfo": {"py_callstack": detail, "timestamp": str(int(now))}},
        "finetune": {
            "rank": rank,
            "time": now,
            "message": message,
            "user_error": user_error,
            "lost_contact": lost_contact,  # a consequence of another rank's failure, not a cause
        },
    }
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


@contextlib.contextmanager
def rank_failures(ctx: DistContext, passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """On several ranks: record a failure for the launcher and name the rank in its one-line message.

    A UserError keeps its type with "rank N: " in front; any other exception becomes a RankFailed (a
    UserError, so the command line prints one line, not a traceback per rank: the traceback goes to the
    error file). `passthrough` exceptions (a coordinated stop that every rank raises) are left alone.
    """
    if not ctx.distributed:
        yield
        return
    try:
        yield
    except passthrough:
        raise
    except UserError as exc:
        record_failure(str(exc), ctx.rank, user_error=True)
        exc.args = (f"rank {ctx.rank}: {exc}",)
        raise
    except Exception as exc:
        message = _describe(exc)
        record_failure(message, ctx.rank, user_error=False, lost_contact=_lost_contact(exc))
        raise RankFailed(f"rank {ctx.rank}: {message}") from exc
