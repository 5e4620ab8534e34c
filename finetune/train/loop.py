"""The training loop: plan.total_steps optimizer steps over the training examples, read with one process in mind.

    result = train_loop(model, prepared.train, prepared.val, plan, out)

Each step: the step's examples (from the seed, the epoch and the effective batch) -> this process's
micro-batches -> each micro-batch's loss_sum / the whole step's normaliser -> backward (gradients add up)
-> clip -> AdamW. Validation, metrics.jsonl and checkpoints follow the plan's intervals.

What varies is passed in as plain values: the objective (objective.py: supervised or preference tuning) and
the way the model is held on several processes (distributed.parallelism: one device, DDP or FSDP). With one
process every call on `how` places the model, hands the micro-batches back as they are, and reduces nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from finetune.data.arrays import record_lengths
from finetune.placement.where import of_plan
from finetune.plan.plan import Plan
from finetune.report.metrics import MetricsLog, read_metrics
from finetune.report.stability import LOSS_SPIKE, SpikeWatch
from finetune.rules.arithmetic import evaluates_after
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import check_resume
from finetune.settings.wording import ref, render
from finetune.train.checkpoint import (
    TrainState,
    checkpoint_dir,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    read_state,
    save_checkpoint,
)
from finetune.train.distributed import DistContext, Parallelism, agree_on_stop, barrier, local_value, parallelism
from finetune.train.guards import diverged_message, nonfinite_weights
from finetune.train.model import trainable_parameters
from finetune.train.objective import Objective, TokenNormalisedSFT
from finetune.train.order import StepSchedule, schedule_tokens
from finetune.train.schedule import lr_at

log = logging.getLogger("finetune")


class TrainingInterrupted(UserError):
    """SIGTERM/SIGINT: a checkpoint was saved at a step boundary; the run can be resumed."""

    def __init__(self, step: int, total: int, signum: int, checkpoint: Path) -> None:
        self.signum = signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after step {step} of {total}; "
            f"checkpoint saved in {checkpoint}. Resume with the same command plus {ref('resume')}."
        )


class TrainingDiverged(UserError):
    """The loss became NaN or infinite; nothing of that step was applied."""


@dataclass
class LoopResult:
    steps: int
    best_step: int | None
    best_val_loss: float | None
    final_train_loss: float | None
    wall_time_s: float
    tokens_processed: int  # tokens of the training examples fed through the model, all ranks, resumed steps too
    allowed_changes: list = dataclasses.field(default_factory=list)  # settings changed on --resume --allow-changes
    tokens_billed: int = 0  # of them, those of the records billed (all of them but the base's replay rows)


def train_loop(
    model,
    train: Sequence,
    val: Sequence,
    plan: Plan,
    out: Path,
    ctx: DistContext | None = None,
    objective: Objective | None = None,
    pad_id: int = 0,
    resume: bool = False,
    on_step: Callable[[dict], None] | None = None,
    fingerprint: dict | None = None,
    allow_changes: str | None = None,
    general_val: Sequence = (),
    billed: Sequence[bool] | None = None,
) -> LoopResult:
    """Take plan.total_steps optimizer steps over `train`; evaluate on `val`, checkpoint and log as planned.
    `general_val`: the forgetting curve's records, evaluated beside `val` (general_val_loss; loop.Validation).
    `billed`: per training record, whether its tokens are billed (None: every record's; rules/billing.py): the loop
    counts them as it reads them, and keeps the count in every checkpoint.

    `on_step(row)` gets each metrics row after its checkpoint (with `checkpoint_s` and `checkpoint_cpu_s` when
    one was saved; metrics.jsonl does not have them).
    """
    # ---- set-up: the model on its device(s), AdamW, and where a resumed run starts
    ctx, objective = ctx or DistContext(), objective or TokenNormalisedSFT()
    bf16 = of_plan(plan, ctx.device).autocast  # the run's precision (placement/where.py): bf16 passes under autocast
    how = parallelism(plan, ctx, bf16)
    model.train()
    loss_of = how.wrap(model, objective, filler=objective.batch([train[0]], plan, pad_id))  # filler: FSDP only
    params = [p for _, p in trainable_parameters(model)]
    optimizer = build_optimizer(model, plan.learning_rate, plan.weight_decay, fused=how.fused_optimizer)
    lengths = record_lengths(train)
    state, metrics, spikes = _start(out, model, optimizer, plan, len(train), ctx, fingerprint, resume, allow_changes)
    checks = Validation(loss_of, objective, val, general_val, plan, ctx, how, pad_id, bf16, model, state)
    # the resume cursor is the step count alone: the records of step k follow from (seed, epoch, effective batch)
    steps = StepSchedule(len(train), plan.effective_batch, plan.seed, plan.last_batch, plan.steps_per_epoch)
    tokens = TokenCount(state, lengths, billed, plan)
    started, time_before, last_loss = time.perf_counter(), state.elapsed_s, None

    with StopRequest() as stop:
        for step_index in range(state.step, plan.total_steps):
            step_start = time.perf_counter()
            step_examples = steps.examples(step_index)
            normaliser = objective.normaliser([train[i] for i in step_examples])  # the whole step's, on every rank
            lr = _set_learning_rate(optimizer, step_index, plan)

            # ---- forward and backward over this process's micro-batches, then the update
            sums = MetricSums(objective.metric_names)
            for micro in how.micro_batches(step_examples, lengths):
                batch = objective.batch([train[i] for i in micro], plan, pad_id).to(ctx.device)
                sums.add(*_backward(loss_of, batch, normaliser, ctx.device, bf16))
            how.reduce_gradients(params)
            step_metrics = sums.means(normaliser, how.reduce_sum)
            train_loss = step_metrics.pop("loss")
            grad_norm = _update(optimizer, params, plan, train_loss, step_index + 1, out, ctx)
            state.step, last_loss = step_index + 1, train_loss
            step_tokens = tokens.add(step_examples, state)
            stop_signum = agree_on_stop(stop.signum, ctx)  # a signal on any rank stops every rank after this step

            # ---- evaluation, metrics, checkpoint
            row = {"step": state.step, "epoch": round(state.step / plan.steps_per_epoch, 4), "learning_rate": lr}
            row |= {"train_loss": train_loss, "grad_norm": grad_norm, objective.normaliser_name: normaliser}
            row |= {"tokens_per_s": step_tokens / max(1e-9, time.perf_counter() - step_start), **step_metrics}
            if spikes.observe(train_loss):
                row["warning"] = LOSS_SPIKE  # more than 10x the running mean: the report calls the run unstable
            last_step = state.step == plan.total_steps
            row |= checks.after(state)  # val_loss (and general_val_loss) on evaluation steps; the best step
            if metrics:  # before the checkpoint: a resume drops rows past its checkpoint, never misses one
                metrics.append(row)
            if state.step % plan.save_every == 0 or last_step or "val_loss" in row or stop_signum is not None:
                state.elapsed_s = time_before + time.perf_counter() - started
                row = {**row, **_save(out, model, optimizer, state, plan, ctx)}  # its timings: for on_step only
            if on_step:
                on_step(row)
            if stop_signum is not None and not last_step:
                raise TrainingInterrupted(state.step, plan.total_steps, stop_signum, checkpoint_dir(out, state.step))

    return _result(state, last_loss, time_before + time.perf_counter() - started, tokens)


def _result(state: TrainState, last_loss: float | None, wall_time: float, tokens: TokenCount) -> LoopResult:
    return LoopResult(state.step, state.best_step, state.best_val_loss, last_loss, wall_time, tokens.read,
                      state.allowed_changes, tokens.billed)  # fmt: skip


class TokenCount:
    """The tokens the steps read, and of them those billed (`billed`: per record, None: every record's), counted
    record by record as the steps read them and kept in the state each checkpoint saves: a resumed run goes on from
    the checkpoint's counts (one older than them has them replayed from the schedule: the records of each step
    follow from the seed, the epoch and the effective batch)."""

    def __init__(self, state: TrainState, lengths: list[int], billed: Sequence[bool] | None, plan: Plan) -> None:
        self.lengths = lengths
        self.billed_lengths = (
            lengths if billed is None else [n if b else 0 for n, b in zip(lengths, billed, strict=True)]
        )
        self.read, self.billed = state.tokens_read or 0, state.tokens_billed or 0
        if state.step and (state.tokens_read is None or state.tokens_billed is None):
            replay = lambda sizes: schedule_tokens(sizes, plan.effective_batch, plan.seed, plan.last_batch, state.step)  # noqa: E731
            self.read, self.billed = replay(lengths), replay(self.billed_lengths)

    def add(self, step_examples: Sequence[int], state: TrainState) -> int:
        """Count one step's records (into `state` too); the tokens it read."""
        step_tokens = sum(self.lengths[i] for i in step_examples)
        self.read += step_tokens
        self.billed += sum(self.billed_lengths[i] for i in step_examples)
        state.tokens_read, state.tokens_billed = self.read, self.billed
        return step_tokens


# ============================================================================ the pieces of a step


def _set_learning_rate(optimizer, step_index: int, plan: Plan) -> float:
    """The schedule's learning rate for this step (0-based), set on every parameter group; returns it."""
    lr = lr_at(step_index, plan.total_steps, plan.warmup_steps, plan.learning_rate, plan.schedule)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def _backward(loss_of, batch, normaliser: float, device: torch.device, bf16: bool):
    """One micro-batch's forward and backward; its (loss_sum, metric_sums), for the step's MetricSums."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss_sum, metric_sums = loss_of(batch)
    # each .backward() adds to .grad, and loss_sum is a SUM: dividing by the step's normaliser (its target tokens,
    # or pairs, over every micro-batch and rank) makes the gradients add up to those of the whole step's mean,
    # however the step is split (the mean of micro-batch means is the bug)
    (loss_sum / normaliser).backward()
    return loss_sum, metric_sums


class MetricSums:
    """A step's (or the validation set's) loss and metric sums; reduced over ranks and divided by the normaliser."""

    def __init__(self, names: Sequence[str]) -> None:
        # seeded with the names: a rank without an example still reduces the same numbers as the others
        self.sums = {"loss": torch.zeros((), dtype=torch.float64)} | dict.fromkeys(names, 0.0)

    def add(self, loss_sum: torch.Tensor, metric_sums: dict[str, torch.Tensor]) -> None:
        for name, value in {"loss": loss_sum, **metric_sums}.items():
            self.sums[name] = self.sums[name] + value.detach().double().cpu()

    def totals(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        names = sorted(self.sums)  # every rank has the same names, in the same order
        stacked = reduce_sum(torch.stack([torch.as_tensor(self.sums[n], dtype=torch.float64) for n in names]))
        return {name: float(total) for name, total in zip(names, stacked, strict=True)}

    def means(self, normaliser: float, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        return {name: total / normaliser for name, total in self.totals(reduce_sum).items()}


def _update(optimizer, params, plan: Plan, train_loss: float, step: int, out: Path, ctx: DistContext) -> float:
    """Clip and apply the step's gradients; TrainingDiverged (nothing applied, nothing saved) on a NaN or inf."""
    if not math.isfinite(train_loss):
        optimizer.zero_grad(set_to_none=True)
        what = f"the training loss became {train_loss}"
        raise TrainingDiverged(diverged_message(what, step, out, plan.learning_rate))
    grad_norm = float(local_value(torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm or float("inf"))))
    if not math.isfinite(grad_norm):  # NaN gradients would make every weight NaN
        optimizer.zero_grad(set_to_none=True)
        what = f"the gradient norm became {grad_norm} (the loss was {train_loss:.4g})"
        raise TrainingDiverged(diverged_message(what, step, out, plan.learning_rate))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if nonfinite_weights(params, ctx):  # the update itself overflowed: this state is never saved
        raise TrainingDiverged(
            diverged_message("a weight became NaN or infinite in the update", step, out, plan.learning_rate)
        )
    return grad_norm


def _save(out: Path, model, optimizer, state: TrainState, plan: Plan, ctx: DistContext) -> dict:
    """Save a checkpoint (every rank takes part; rank 0 writes) and prune the old ones; how long it took."""
    save_start, save_cpu = time.perf_counter(), time.process_time()
    save_checkpoint(out, model, optimizer, state, plan.method == "lora", ctx)
    if ctx.is_main:
        prune_checkpoints(out, plan.keep_checkpoints, state.best_step)
    barrier(ctx)
    return {"checkpoint_s": time.perf_counter() - save_start, "checkpoint_cpu_s": time.process_time() - save_cpu}


@torch.no_grad()
def evaluate(
    loss_of, objective: Objective, examples: Sequence, plan: Plan, ctx: DistContext, how: Parallelism,
    pad_id: int, bf16: bool, model,
) -> dict[str, float]:  # fmt: skip
    """val_loss = sum(loss_sum) / sum(normaliser) over the whole validation set, sharded across ranks and reduced;
    each of the objective's metrics the same way, as val_<name>."""
    was_training = model.training
    model.eval()
    per_group = max(1, plan.effective_batch // (plan.devices * plan.grad_accum))
    mine = sorted(examples[ctx.rank :: ctx.world_size], key=len)
    sums, normaliser = MetricSums(objective.metric_names), 0.0
    for group in how.eval_groups([mine[i : i + per_group] for i in range(0, len(mine), per_group)]):
        batch = objective.batch(group, plan, pad_id).to(ctx.device)
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=bf16):
            sums.add(*loss_of(batch))
        normaliser += objective.normaliser(group)
    sums.sums["normaliser"] = torch.tensor(normaliser, dtype=torch.float64)
    totals = sums.totals(how.reduce_sum)
    model.train(was_training)
    total = totals.pop("normaliser")
    if total <= 0:
        return {}
    return {"val_loss" if name == "loss" else f"val_{name}": value / total for name, value in totals.items()}


class Validation:
    """A run's evaluations: the team's validation set (val_loss; the best step) and, when the run has one, the
    forgetting curve's set (held-out general prompts answered by the base: general_val_loss), at the same steps and
    normalised the same way (`evaluate`). A fresh run also scores the general set before its first step, when the
    model is still the base (general_val_loss_base, logged in step 1's row). Without a general set every row is
    what it was before the curve existed."""

    def __init__(
        self, loss_of, objective: Objective, val: Sequence, general_val: Sequence, plan: Plan, ctx: DistContext,
        how: Parallelism, pad_id: int, bf16: bool, model, state: TrainState,
    ) -> None:  # fmt: skip
        self.val, self.general_val, self.plan = val, general_val, plan
        self.score = lambda examples: evaluate(loss_of, objective, examples, plan, ctx, how, pad_id, bf16, model)
        self.pending = {}  # keys for the next row
        if general_val and state.step == 0:  # every rank takes part, as in every evaluation
            base = self.score(general_val).get("val_loss")
            self.pending = {} if base is None else {"general_val_loss_base": base}

    def after(self, state: TrainState) -> dict[str, float]:
        """The keys this step's row gains (none on a step without evaluation); the best step follows val_loss."""
        found, self.pending = self.pending, {}
        if not (self.val or self.general_val) or not evaluates_after(
            state.step, self.plan.eval_every, self.plan.steps_per_epoch, self.plan.total_steps
        ):
            return found
        if self.val:
            found |= self.score(self.val)
            if "val_loss" in found and (state.best_val_loss is None or found["val_loss"] < state.best_val_loss):
                state.best_step, state.best_val_loss = state.step, found["val_loss"]
        if self.general_val and (general := self.score(self.general_val)):
            found["general_val_loss"] = general["val_loss"]
        return found


# ============================================================================ set-up


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


class StopRequest:
    """Turns SIGTERM/SIGINT into a flag the loop checks at each step boundary."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopRequest:
        # outside the main thread (e.g. a worker thread) signals cannot be handled: signal.signal raises ValueError
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _start(
    out: Path, model, optimizer, plan: Plan, records: int, ctx: DistContext, fingerprint: dict | None,
    resume: bool, allow_changes: str | None,
) -> tuple[TrainState, MetricsLog | None, SpikeWatch]:  # fmt: skip
    """Where the run starts (step 0, or the newest good checkpoint's step), its metrics log, its spike watch."""
    shape = _run_shape(plan, records)
    state = TrainState(shape=shape, fingerprint=fingerprint or {})
    if resume:
        state = _resume(out, model, optimizer, plan, shape, ctx, fingerprint or {}, allow_changes)
    metrics = MetricsLog(out / "metrics.jsonl") if ctx.is_main else None
    if metrics and resume:
        metrics.truncate_after(state.step)  # rows past the checkpoint belong to steps about to be taken again
    earlier = read_metrics(out / "metrics.jsonl") if metrics else []
    return state, metrics, SpikeWatch([row["train_loss"] for row in earlier if row["step"] <= state.step])


def _run_shape(plan: Plan, records: int) -> dict:
    """What a checkpoint must share with the run that resumes it (the device count may differ)."""
    keys = ("effective_batch", "total_steps", "devices", "seed", "shard")
    return {"records": records, **{key: getattr(plan, key) for key in keys}}


def _resume(
    out: Path, model, optimizer, plan: Plan, shape: dict, ctx: DistContext, fingerprint: dict, allow_changes: str | None
) -> TrainState:
    """The state of the newest checkpoint (the damaged ones were set aside), loaded into model and optimizer;
    a fresh state at step 0 when there is none (a crash before the first save)."""
    found = list_checkpoints(out)
    if not found:
        return TrainState(shape=shape, fingerprint=fingerprint)
    saved_state = read_state(found[-1])
    # what defines the run first: it names the change (a rank change would otherwise be a size-mismatch error)
    changes = check_resume(saved_state.fingerprint, fingerprint, allow_changes, found[-1].name)
    saved = saved_state.shape
    # another device count is fine: the records of every step, and so the updates, do not depend on it
    without_devices = lambda s: {k: v for k, v in s.items() if k != "devices"}  # noqa: E731
    if without_devices(saved) != without_devices(shape):
        raise UserError(
            f"{ref('resume')}: {found[-1]} belongs to a different run shape {saved}, this run is {shape}; "
            "resume with the same data and settings (batch x accumulation x devices equal to the "
            f"checkpoint's effective batch {saved.get('effective_batch')}), or start a new {ref('out')}"
        )
    state = load_checkpoint(found[-1], model, optimizer, plan.method == "lora", ctx)
    if ctx.is_main:  # on the terminal too: the run goes on with values it was not started with
        for change in changes:
            log.info("%s", render(change.accepted(found[-1].name)))
    state.fingerprint = fingerprint  # the checkpoints from now on record the settings in use
    state.allowed_changes = [*state.allowed_changes, *({**c.to_dict(), "at_step": state.step} for c in changes)]
    return state
