"""The training loop: one function that reads top to bottom.

    setup (optimizer, resume) -> for each optimizer step: micro-batches, loss, backward, all-reduce,
    clip, AdamW -> evaluation, checkpoint, metrics -> result

The loss of one optimizer step is the mean over *all* target tokens of the effective batch (every
micro-batch of every device): each micro-batch adds sum(w · nll) / N to the gradient, where N is the
step's global target count. Averaging per micro-batch and then averaging the averages is the classic
bug this avoids; a test checks batch 4 × accumulation 2 gives the weights of batch 8 × accumulation 1.

On several processes (distributed.py) each rank runs its own micro-batches of the same step; gradients
are summed across ranks (one all-reduce, or FSDP's reduce-scatter when the model is sharded), so
2 processes × batch 4 learn what 1 process × batch 4 × accumulation 2 learns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from finetune.data.arrays import record_lengths
from finetune.data.types import IGNORE_INDEX, TokenizedRecord
from finetune.errors import UserError
from finetune.report.metrics import MetricsLog
from finetune.train.batching import Batch, epoch_steps, micro_batches, pack_batch, pad_batch
from finetune.train.checkpoint import (
    TrainState,
    checkpoint_dir,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    read_state,
    save_checkpoint,
)
from finetune.train.distributed import (
    DistContext,
    agree_on_stop,
    all_reduce_gradients,
    all_reduce_sum,
    barrier,
    local_value,
    set_gradient_sync,
    shard_model,
)
from finetune.train.loss import nll_sum
from finetune.train.model import trainable_parameters
from finetune.train.schedule import lr_at


class TrainingInterrupted(UserError):
    """SIGTERM/SIGINT: a checkpoint was saved at a step boundary; the run can be resumed."""

    def __init__(self, step: int, total: int, signum: int, checkpoint: Path) -> None:
        self.signum = signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after step {step} of {total}; "
            f"checkpoint saved in {checkpoint}. Resume with the same command plus --resume."
        )


class TrainingDiverged(UserError):
    """The loss became NaN or infinite; nothing of that step was applied."""


@dataclass(frozen=True)
class LoopSettings:
    """What the loop obeys: the plan's numbers plus the run's options."""

    total_steps: int
    steps_per_epoch: int
    grad_accum: int
    devices: int
    effective_batch: int
    learning_rate: float
    warmup_steps: int
    schedule: str
    last_batch: str
    eval_every: int
    save_every: int
    keep_checkpoints: int
    seed: int
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    max_seq_len: int = 1024
    packing: bool = True
    bf16: bool = False
    is_lora: bool = True
    resume: bool = False
    pad_id: int = 0
    shard: str = "none"  # "full": FSDP-shard the model across the processes


@dataclass
class LoopResult:
    steps: int
    best_step: int | None
    best_val_loss: float | None
    final_train_loss: float | None
    wall_time_s: float
    tokens_processed: int  # real tokens of the training records fed through the model, all ranks


class _StopRequest:
    """Turns SIGTERM/SIGINT into a flag the loop checks at each step boundary."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self) -> _StopRequest:
        # outside the main thread (a service worker) signals cannot be handled: signal.signal raises ValueError
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def build_optimizer(model, lr: float, weight_decay: float, fused: bool) -> torch.optim.AdamW:
    """AdamW with decoupled weight decay on matrices only: never on biases and norm scales.

    The fused kernel is ~5x faster than the default on the CPU too (80 -> 15 ms a step for 20M weights,
    bench/RESULTS.md); sharded (DTensor) parameters keep the default implementation.
    """
    params = trainable_parameters(model)
    decay = [p for _, p in params if p.ndim >= 2]
    no_decay = [p for _, p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, fused=fused or None)


def make_batch(records: list[TokenizedRecord], settings: LoopSettings) -> Batch:
    if settings.packing:
        return pack_batch(records, settings.max_seq_len, settings.pad_id)
    return pad_batch(records, settings.pad_id)


def silent(batch: Batch) -> Batch:
    """The same inputs with nothing scored: a forward and backward that change nothing."""
    return dataclasses.replace(
        batch,
        targets=torch.full_like(batch.targets, IGNORE_INDEX),
        weights=torch.zeros_like(batch.weights),
        num_tokens=0,
    )


def step_batches(
    train: list[TokenizedRecord], step_records: list[int], lengths: list[int], s: LoopSettings, ctx: DistContext
) -> list[Batch]:
    """This rank's micro-batches of one step. Sharded (FSDP), every rank runs as many as the busiest rank,
    padding with silent ones: FSDP gathers and reduces in every forward and backward, and those collectives
    must pair up across ranks (a partial last step leaves some ranks short)."""
    mine = micro_batches(step_records, lengths, s.devices, s.grad_accum, ctx.rank)
    batches = [make_batch([train[i] for i in micro], s) for micro in mine]
    if s.shard == "full" and ctx.distributed:
        busiest = max(len(micro_batches(step_records, lengths, s.devices, s.grad_accum, r)) for r in range(s.devices))
        batches += [silent(make_batch([train[step_records[0]]], s))] * (busiest - len(batches))
    return batches


@torch.no_grad()
def evaluate(
    model,
    records: list[TokenizedRecord],
    settings: LoopSettings,
    ctx: DistContext,
    batch_records: int,
    loss_of: Callable[[Batch], torch.Tensor] | None = None,
):
    """Weighted mean NLL over the whole validation set, sharded across ranks and reduced token-weighted."""
    was_training = model.training
    model.eval()
    loss_of = loss_of or partial(nll_sum, model)
    mine = sorted(records[ctx.rank :: ctx.world_size], key=len)
    batches = [make_batch(mine[i : i + batch_records], settings) for i in range(0, len(mine), batch_records)]
    if settings.shard == "full" and ctx.distributed:  # FSDP: as many forwards as rank 0, which has the most records
        busiest = -(-len(records[:: ctx.world_size]) // batch_records)
        batches += [silent(make_batch(records[:1], settings))] * (busiest - len(batches))
    totals = torch.zeros(2, dtype=torch.float64)  # [sum of w·nll, target tokens]
    for batch in batches:
        batch = batch.to(ctx.device)
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=settings.bf16):
            totals[0] += loss_of(batch).double().cpu()
        totals[1] += batch.num_targets
    all_reduce_sum(totals, ctx)
    model.train(was_training)
    return float(totals[0] / totals[1]) if totals[1] > 0 else None


def _without_devices(shape: dict) -> dict:
    return {key: value for key, value in shape.items() if key != "devices"}


def train_loop(
    model,
    train: list[TokenizedRecord],
    val: list[TokenizedRecord],
    settings: LoopSettings,
    out: Path,
    ctx: DistContext,
    on_step: Callable[[dict], None] | None = None,
) -> LoopResult:
    s = settings
    # ---------------------------------------------------------------- setup
    sharded = s.shard == "full" and ctx.distributed
    if not sharded:
        model.to(ctx.device)  # fully_shard moves the model to the device unit by unit, never whole
    model.train()
    # sharded, the loss runs inside FSDP's root module so that it gathers the embeddings and the head
    loss_of = shard_model(model, ctx) if sharded else partial(nll_sum, model)
    params = [p for _, p in trainable_parameters(model)]
    optimizer = build_optimizer(model, s.learning_rate, s.weight_decay, fused=not sharded)
    lengths = record_lengths(train)  # O(records) with TokenArrays: no token is touched
    shape = {
        "records": len(train),
        "effective_batch": s.effective_batch,
        "total_steps": s.total_steps,
        "devices": s.devices,
        "seed": s.seed,
        "shard": s.shard,
    }
    state = TrainState(shape=shape)
    metrics = MetricsLog(out / "metrics.jsonl") if ctx.is_main else None
    if s.resume:
        found = list_checkpoints(out)
        if not found:
            raise UserError(f"--resume: no checkpoint in {out / 'checkpoints'}")
        saved = read_state(found[-1]).shape
        # another device count is fine: the records of every step, and so the updates, do not depend on it
        if _without_devices(saved) != _without_devices(shape):
            raise UserError(
                f"--resume: {found[-1]} belongs to a different run shape {saved}, this run is {shape}; "
                "resume with the same data and settings (batch x accumulation x devices equal to the "
                f"checkpoint's effective batch {saved.get('effective_batch')}), or start a new --out"
            )
        state = load_checkpoint(found[-1], model, optimizer, s.is_lora, ctx)
        if metrics:
            metrics.truncate_after(state.step)
    eval_batch_records = max(1, s.effective_batch // max(1, s.devices * s.grad_accum))
    epoch_plan: dict[int, list[list[int]]] = {}  # epoch -> record indices of each step

    # ---------------------------------------------------------------- loop
    started = time.perf_counter()
    last_loss = None
    with _StopRequest() as stop:
        for step_index in range(state.step, s.total_steps):
            step_start = time.perf_counter()
            epoch, within = divmod(step_index, s.steps_per_epoch)
            if epoch not in epoch_plan:
                epoch_plan = {epoch: epoch_steps(len(train), s.effective_batch, s.seed, epoch, s.last_batch)}
            step_records = epoch_plan[epoch][within]
            global_targets = sum(train[i].num_targets for i in step_records)  # the same on every rank
            lr = lr_at(step_index, s.total_steps, s.warmup_steps, s.learning_rate, s.schedule)
            for group in optimizer.param_groups:
                group["lr"] = lr

            loss_sum = torch.zeros((), dtype=torch.float64)
            local_tokens = 0
            batches = step_batches(train, step_records, lengths, s, ctx)
            for j, batch in enumerate(batches):
                set_gradient_sync(loss_of, j == len(batches) - 1)  # FSDP: reduce-scatter after the last one only
                batch = batch.to(ctx.device)
                with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=s.bf16):
                    nll = loss_of(batch)
                (nll / global_targets).backward()  # grads sum over micro-batches => normalise by the step's N here
                loss_sum += nll.detach().double().cpu()
                local_tokens += batch.num_tokens
            if not sharded:
                all_reduce_gradients(params, ctx)  # sum over ranks; each rank already divided by the global N
            step_stats = all_reduce_sum(torch.tensor([float(loss_sum), float(local_tokens)], dtype=torch.float64), ctx)
            train_loss = float(step_stats[0]) / global_targets
            if not math.isfinite(train_loss):
                optimizer.zero_grad(set_to_none=True)
                last_good = list_checkpoints(out)
                where = f"the last good checkpoint is {last_good[-1]}" if last_good else "no checkpoint was saved yet"
                raise TrainingDiverged(
                    f"the training loss became {train_loss} at step {step_index + 1}; the step was not applied and "
                    f"{where}. Try a lower --lr (now {s.learning_rate:g}) or check the data."
                )
            grad_norm = torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm or float("inf"))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state.step = step_index + 1
            last_loss = train_loss
            stop_signum = agree_on_stop(stop.signum, ctx)  # a signal on any rank stops every rank after this step

            # ------------------------------------------------------------ evaluation, checkpoint, metrics
            end_of_epoch = state.step % s.steps_per_epoch == 0
            last_step = state.step == s.total_steps
            row = {
                "step": state.step,
                "epoch": round(state.step / s.steps_per_epoch, 4),
                "lr": lr,
                "train_loss": train_loss,
                "grad_norm": float(local_value(grad_norm)),
                "target_tokens": global_targets,
                "tokens_per_s": float(step_stats[1]) / max(1e-9, time.perf_counter() - step_start),
            }
            if val and (state.step % s.eval_every == 0 or end_of_epoch or last_step):
                row["val_loss"] = evaluate(model, val, s, ctx, eval_batch_records, loss_of)
                if state.best_val_loss is None or row["val_loss"] < state.best_val_loss:
                    state.best_step, state.best_val_loss = state.step, row["val_loss"]
            if metrics:  # before the checkpoint: a resume drops rows past its checkpoint, never misses one
                metrics.append(row)
            save_now = state.step % s.save_every == 0 or last_step or "val_loss" in row or stop_signum is not None
            if save_now:
                save_checkpoint(out, model, optimizer, state, s.is_lora, ctx)  # every rank; rank 0 writes
                if ctx.is_main:
                    prune_checkpoints(out, s.keep_checkpoints, state.best_step)
                barrier(ctx)
            if on_step:
                on_step(row)
            if stop_signum is not None and not last_step:
                raise TrainingInterrupted(state.step, s.total_steps, stop_signum, checkpoint_dir(out, state.step))

    # every step's records are known from the seed, so this also counts the steps done before a resume
    tokens_processed = sum(
        lengths[i]
        for step_index in range(state.step)
        for i in epoch_steps(len(train), s.effective_batch, s.seed, step_index // s.steps_per_epoch, s.last_batch)[
            step_index % s.steps_per_epoch
        ]
    )
    return LoopResult(
        steps=state.step,
        best_step=state.best_step,
        best_val_loss=state.best_val_loss,
        final_train_loss=last_loss,
        wall_time_s=time.perf_counter() - started,
        tokens_processed=tokens_processed,
    )
