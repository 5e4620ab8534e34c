"""The training recipe: one run, top to bottom. Set-up -> loop -> evaluate/save -> export -> report.

    from finetune import RunConfig, train
    result = train(RunConfig(data="train.jsonl", model="path/to/model", out="runs/one"))
    result.report["final_val_loss"], result.plan.total_steps, result.final_weights

Outputs (OUT = config.out): plan.json, metrics.jsonl, loss_curve.png, report.json, checkpoints/, and
adapter/ (LoRA, PEFT format) or model/ (full, save_pretrained). Only rank 0 writes them. The library call
prints nothing: `on_plan(plan)` and `on_step(row)` let a caller show the plan and progress (the command
line does, on stderr), and notes go to the `finetune` logger.

The type chain: RunConfig -> prepare_data -> DataSummary -> build_plan -> Plan -> train_loop(plan) ->
build_report(plan) -> TrainResult. The loop obeys the Plan; nothing copies it.

The objective is a parameter of the loop (objective.py): TokenNormalisedSFT by default, the mean weighted
NLL over every target token of a step. Another objective (preference tuning: pairs in one micro-batch,
sequence log-probabilities, a reference model by disabling the adapter, normalised by pairs) reuses this
loop, its checkpoints, resume and the distributed code unchanged; see objective.py for the interface.

One process, DDP and FSDP differ in four calls on a `SingleDevice` / `Replicated` / `Sharded` object
chosen once (distributed.parallelism): wrap the model, start a micro-batch, reduce the gradients, and how
many micro-batches a rank runs. Read with one process in mind, they do nothing. Under torchrun
(`finetune train --devices N`, launch.py) every process runs this same code; see docs/distributed.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from finetune.config import RunConfig
from finetune.data.arrays import record_lengths
from finetune.data.preference import is_preference_file, prepare_pairs
from finetune.data.prepare import PreparedData, prepare_data
from finetune.data.skipped import write_skipped
from finetune.data.tokenize import load_tokenizer
from finetune.errors import UserError
from finetune.model_source import resolve_model
from finetune.plan.model_facts import load_model_facts
from finetune.plan.plan import Plan, build_plan
from finetune.report.diagnosis import diagnose
from finetune.report.metrics import MetricsLog, read_metrics
from finetune.report.plot import plot_loss_curve
from finetune.report.preference import diagnose_preference, preference_summary
from finetune.report.stability import LOSS_SPIKE, SpikeWatch
from finetune.report.summary import build_report, write_report
from finetune.train.attention import use_varlen_attention
from finetune.train.batching import epoch_steps, micro_batches, schedule_tokens
from finetune.train.checkpoint import (
    TrainState,
    checkpoint_dir,
    copy_weights,
    find_resume_point,
    list_checkpoints,
    load_checkpoint,
    load_weights_only,
    prune_checkpoints,
    read_state,
    remove_stale_tmp,
    save_checkpoint,
    set_aside_damaged,
)
from finetune.train.distributed import (
    DistContext,
    SingleDevice,
    agree_on_stop,
    all_reduce_sum,
    barrier,
    init_distributed,
    local_value,
    parallelism,
    rank_failures,
    shutdown,
)
from finetune.train.fingerprint import check_resume, run_fingerprint
from finetune.train.guards import (
    check_out_folder,
    disk_full_error,
    diverged_message,
    finished_message,
    finished_report,
    nonfinite_weights,
)
from finetune.train.model import (
    add_lora,
    attention_for,
    enable_gradient_checkpointing,
    load_model,
    trainable_parameters,
)
from finetune.train.objective import Objective, TokenNormalisedSFT
from finetune.train.preference import PAIRS_NO_TEST_SPLIT, compute_reference, objective_for
from finetune.train.schedule import lr_at

log = logging.getLogger("finetune")
RUN_FILES = ("plan.json", "metrics.jsonl", "report.json", "checkpoints", "adapter", "model")


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


@dataclass
class LoopResult:
    steps: int
    best_step: int | None
    best_val_loss: float | None
    final_train_loss: float | None
    wall_time_s: float
    tokens_processed: int  # tokens of the training examples fed through the model, all ranks, resumed steps too
    allowed_changes: list = dataclasses.field(default_factory=list)  # settings changed on --resume --allow-changes


@dataclass
class TrainResult:
    """What `finetune.train(config)` returns (on rank 0; other ranks get `report == {}`)."""

    out_dir: Path
    plan: Plan
    report: dict  # the content of report.json
    final_weights: Path | None  # OUT/adapter or OUT/model
    loop: LoopResult | None


# ============================================================================ set-up


def train(
    config: RunConfig,
    on_plan: Callable[[Plan], None] | None = None,
    on_step: Callable[[dict], None] | None = None,
    objective: Objective | None = None,
    ctx: DistContext | None = None,
) -> TrainResult:
    """Plan, train, export and report one run. Prints nothing; see the module docstring."""
    config.check_required("train")
    joined = ctx is None
    ctx = ctx or init_distributed()
    if ctx.is_main:
        check_out_folder(Path(config.out))  # before anything slow: the model may be minutes of download away
    config = dataclasses.replace(config, model=resolve_model(config.model))  # adapter_config: a path from anywhere
    if config.gpu is None and ctx.device.type == "cpu":
        config = dataclasses.replace(config, gpu="cpu")  # size time and memory for the machine we are on
    try:
        with rank_failures(ctx, passthrough=(TrainingInterrupted,)):  # every rank stops alike: no rank to name
            try:
                result = _train(config, on_plan, on_step, objective, ctx)
                barrier(ctx)  # every rank leaves together: none tears down its process group while rank 0 still writes
                return result
            except OSError as exc:
                if (full := disk_full_error(exc, Path(config.out))) is not None:
                    raise full from None
                raise
    finally:
        if joined:
            shutdown(ctx)


def _train(
    config: RunConfig,
    on_plan: Callable[[Plan], None] | None,
    on_step: Callable[[dict], None] | None,
    objective: Objective | None,
    ctx: DistContext,
) -> TrainResult:
    out = Path(config.out)
    if ctx.is_main:
        _check_out_dir(out, config.resume)
        _prepare_resume(out, config.resume)
    barrier(ctx)  # the damaged checkpoints are set aside before any rank looks for the newest one
    if config.test_fraction and config.method == "dpo":
        raise UserError(PAIRS_NO_TEST_SPLIT)
    if config.test_fraction:
        from finetune.eval.test_split import hold_out_test

        config = hold_out_test(config, out)  # before the split and the plan: the test set is never trained on

    # ---- data and plan: the plan the run writes is the plan it executes (tokens of the exact steps)
    tokenizer = load_tokenizer(config.model, config.trust_remote_code, config.chat_template)  # issue 21: the template
    if config.method != "dpo" and is_preference_file(config.data):
        raise UserError(f"{config.data} holds preference pairs (chosen/rejected): train on it with --method dpo")
    if config.method == "dpo":
        prepared = prepare_pairs(config, tokenizer)
    else:
        prepared = _prepare_on_every_rank(config, tokenizer, ctx)
        if prepared.from_cache and ctx.is_main:
            log.info("tokenized data read from the token cache (%s)", prepared.cache_entry)
    lengths = record_lengths(prepared.train)  # O(examples): no token is touched
    plan = build_plan(
        config,
        prepared.summary,
        load_model_facts(config.model),
        step_tokens=lambda effective, steps: schedule_tokens(lengths, effective, config.seed, config.last_batch, steps),
    )
    if plan.devices != ctx.world_size:
        raise UserError(f"the plan is for {plan.devices} device(s) but {ctx.world_size} process(es) are running")
    if config.resume and (finished := finished_report(out, plan.total_steps)) is not None:
        if ctx.is_main:  # every rank sees the same files: all stop here, and nothing is written
            log.warning("%s", finished_message(out, finished))
        return TrainResult(out, plan, finished if ctx.is_main else {}, Path(finished["final_weights"]), None)
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2))
        write_skipped(out, prepared.skipped)
        if on_plan:
            on_plan(plan)

    objective = objective or (objective_for(plan) if plan.objective == "dpo" else TokenNormalisedSFT())

    # ---- model
    model = load_model(config.model, torch.float32, config.trust_remote_code, attention_for(ctx.device), len(tokenizer))
    if plan.packing:
        use_varlen_attention(model)  # packed records run as one row, attention record by record: no filler, no mask
    if plan.method == "lora":
        model = add_lora(
            model, plan.lora_rank, plan.lora_alpha, plan.lora_dropout, plan.seed, bool(plan.lora_train_head)
        )
    if plan.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    torch.manual_seed(plan.seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if getattr(objective, "precomputed_reference", False):  # full preference tuning: the starting model's log-probs
        compute_reference(model, [*prepared.train, *prepared.val], ctx.device, pad_id, use_bf16(plan.dtype, ctx.device))
    if config.resume and ctx.is_main and (note := _resume_note(out, plan.devices)):
        log.info("note: %s", note)
    log.info("training %d steps; outputs in %s", plan.total_steps, out)

    # ---- train
    result = train_loop(
        model, prepared.train, prepared.val, plan, out, ctx,
        objective=objective, pad_id=pad_id, resume=config.resume, on_step=on_step,
        fingerprint=run_fingerprint(config, plan), allow_changes=config.allow_changes,
    )  # fmt: skip
    if not ctx.is_main:
        return TrainResult(out, plan, {}, None, result)

    # ---- export and report
    final, is_best = export_final(model, tokenizer, out, result, plan)
    report = write_run_report(out, plan, result, final, is_best)
    write_model_card(out, final, plan)
    return TrainResult(out, plan, report, final, result)


def _prepare_on_every_rank(config: RunConfig, tokenizer, ctx: DistContext) -> PreparedData:
    """Rank 0 tokenizes (on every core) and fills the token cache; the other ranks then read the cache."""
    if not ctx.distributed or not config.cache:
        return prepare_data(config, tokenizer, workers=None if ctx.is_main else 1)
    prepared, failure = None, None
    if ctx.is_main:
        try:
            prepared = prepare_data(config, tokenizer)
        except Exception as exc:  # the others must not wait for it forever: they fail the same way on their own
            failure = exc
    barrier(ctx)
    if failure is not None:
        raise failure
    return prepared or prepare_data(config, tokenizer, workers=1)


def _check_out_dir(out: Path, resume: bool) -> None:
    """Never overwrite a previous run by accident."""
    taken = [name for name in RUN_FILES if (out / name).exists()]
    if taken and not resume:
        raise UserError(
            f"{out} already holds a run ({', '.join(taken)}); pass --resume to continue it, or choose another --out"
        )


def _prepare_resume(out: Path, resume: bool) -> None:
    """Remove what a crash left half-written; on --resume, say what was found and set damaged checkpoints aside."""
    remove_stale_tmp(out)
    if not resume:
        return
    point = find_resume_point(out)
    if message := point.message(out):
        log.warning("%s", message)
    set_aside_damaged(point)


def _resume_note(out: Path, devices: int) -> str | None:
    """What resuming on another device count means (the loop allows it)."""
    found = list_checkpoints(out)
    before = read_state(found[-1]).shape.get("devices") if found else None
    if before in (None, devices):
        return None
    return (
        f"resuming on {devices} device(s) a run checkpointed on {before}: every step keeps its records, so the "
        "weights equal an uninterrupted run's up to float rounding (with LoRA dropout on, the masks differ)"
    )


def use_bf16(dtype: str, device: torch.device) -> bool:
    if dtype == "bf16":
        return True
    # fp32 on the CPU by default: bf16 changes numerics, and the equivalence tests run in fp32
    return dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()


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


class _StopRequest:
    """Turns SIGTERM/SIGINT into a flag the loop checks at each step boundary."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}

    def __enter__(self) -> _StopRequest:
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
            f"--resume: {found[-1]} belongs to a different run shape {saved}, this run is {shape}; "
            "resume with the same data and settings (batch x accumulation x devices equal to the "
            f"checkpoint's effective batch {saved.get('effective_batch')}), or start a new --out"
        )
    state = load_checkpoint(found[-1], model, optimizer, plan.method == "lora", ctx)
    state.fingerprint = fingerprint  # the checkpoints from now on record the settings in use
    state.allowed_changes = [*state.allowed_changes, *({**c.to_dict(), "at_step": state.step} for c in changes)]
    return state


# ============================================================================ the loop


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
) -> LoopResult:
    """Take plan.total_steps optimizer steps over `train`; evaluate on `val`, checkpoint and log as planned.

    Each step: the step's examples (from the seed, epoch and effective batch) -> this rank's micro-batches ->
    loss_sum / the step's normaliser -> backward (gradients add up over micro-batches and ranks) -> clip ->
    AdamW. `on_step(row)` gets each metrics row after its checkpoint (with `checkpoint_s` and `checkpoint_cpu_s`
    when one was saved; metrics.jsonl does not have them).
    """
    ctx = ctx or DistContext()
    objective = objective or TokenNormalisedSFT()
    how = parallelism(plan.shard, ctx)
    bf16 = use_bf16(plan.dtype, ctx.device)
    model.train()
    loss_of = how.wrap(model, objective)
    params = [p for _, p in trainable_parameters(model)]
    optimizer = build_optimizer(model, plan.learning_rate, plan.weight_decay, fused=how.fused_optimizer)
    lengths = record_lengths(train)
    shape = _run_shape(plan, len(train))
    state = TrainState(shape=shape, fingerprint=fingerprint or {})
    metrics = MetricsLog(out / "metrics.jsonl") if ctx.is_main else None
    if resume:
        state = _resume(out, model, optimizer, plan, shape, ctx, fingerprint or {}, allow_changes)
        if metrics:
            metrics.truncate_after(state.step)
    earlier = read_metrics(out / "metrics.jsonl") if metrics else []
    spikes = SpikeWatch([row["train_loss"] for row in earlier if row["step"] <= state.step])
    # tokens are counted as the loop runs; the steps before a resume are counted once, from the schedule
    tokens_processed = schedule_tokens(lengths, plan.effective_batch, plan.seed, plan.last_batch, state.step)
    eval_batch = max(1, plan.effective_batch // (plan.devices * plan.grad_accum))

    started = time.perf_counter()
    time_before = state.elapsed_s  # the sessions before a resume: the run's time adds up across them
    last_loss = None
    epoch_plan: tuple[int, list[list[int]]] = (-1, [])  # (epoch, example indices of each of its steps)
    with _StopRequest() as stop:
        for step_index in range(state.step, plan.total_steps):
            step_start = time.perf_counter()
            epoch, within = divmod(step_index, plan.steps_per_epoch)
            if epoch != epoch_plan[0]:
                epoch_plan = (epoch, epoch_steps(len(train), plan.effective_batch, plan.seed, epoch, plan.last_batch))
            step_examples = epoch_plan[1][within]
            normaliser = objective.normaliser([train[i] for i in step_examples])  # the same on every rank
            lr = lr_at(step_index, plan.total_steps, plan.warmup_steps, plan.learning_rate, plan.schedule)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # ---- forward and backward over this rank's micro-batches
            mine = micro_batches(step_examples, lengths, plan.devices, plan.grad_accum, ctx.rank)
            runs = how.micro_batches_to_run(len(mine), partial(_micro_batches_per_rank, step_examples, lengths, plan))
            sums = {"loss": torch.zeros((), dtype=torch.float64)} | dict.fromkeys(
                getattr(objective, "metric_names", ()), 0.0
            )
            for j in range(runs):
                how.micro_batch_starts(last=j == runs - 1)
                scored = j < len(mine)  # beyond `mine`: a forward and backward that score nothing (see Sharded)
                examples = [train[i] for i in mine[j]] if scored else [train[step_examples[0]]]
                batch = objective.batch(examples, plan, pad_id).to(ctx.device)
                with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss_sum, metric_sums = loss_of(batch)
                (loss_sum * (1.0 if scored else 0.0) / normaliser).backward()
                if scored:
                    for name, value in {"loss": loss_sum, **metric_sums}.items():
                        sums[name] = sums.get(name, 0) + value.detach().double().cpu()
            how.reduce_gradients(params)
            names = sorted(sums)  # every rank has the same metric names (the loss's dict keys)
            totals = all_reduce_sum(torch.stack([torch.as_tensor(sums[n], dtype=torch.float64) for n in names]), ctx)
            step_metrics = {name: float(total) / normaliser for name, total in zip(names, totals, strict=True)}
            train_loss = step_metrics.pop("loss")
            if not math.isfinite(train_loss):
                optimizer.zero_grad(set_to_none=True)
                what = f"the training loss became {train_loss}"
                raise TrainingDiverged(diverged_message(what, step_index + 1, out, plan.learning_rate))
            grad_norm = torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm or float("inf"))
            if not math.isfinite(float(local_value(grad_norm))):  # NaN gradients would make every weight NaN
                optimizer.zero_grad(set_to_none=True)
                what = f"the gradient norm became {float(local_value(grad_norm))} (the loss was {train_loss:.4g})"
                raise TrainingDiverged(diverged_message(what, step_index + 1, out, plan.learning_rate))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if nonfinite_weights(params, ctx):  # the update itself overflowed: this state is never saved
                what = "a weight became NaN or infinite in the update"
                raise TrainingDiverged(diverged_message(what, step_index + 1, out, plan.learning_rate))
            state.step = step_index + 1
            last_loss = train_loss
            step_tokens = sum(lengths[i] for i in step_examples)
            tokens_processed += step_tokens
            stop_signum = agree_on_stop(stop.signum, ctx)  # a signal on any rank stops every rank after this step

            # ---- evaluation, metrics, checkpoint
            end_of_epoch = state.step % plan.steps_per_epoch == 0
            last_step = state.step == plan.total_steps
            row = {
                "step": state.step,
                "epoch": round(state.step / plan.steps_per_epoch, 4),
                "lr": lr,
                "train_loss": train_loss,
                "grad_norm": float(local_value(grad_norm)),
                objective.normaliser_name: normaliser,
                "tokens_per_s": step_tokens / max(1e-9, time.perf_counter() - step_start),
                **step_metrics,
            }
            if spikes.observe(train_loss):
                row["warning"] = LOSS_SPIKE  # more than 10x the running mean: the report calls the run unstable
            if val and (state.step % plan.eval_every == 0 or end_of_epoch or last_step):
                row["val_loss"], val_metrics = evaluate(
                    loss_of, objective, val, plan, ctx, eval_batch, pad_id, bf16, model, how
                )
                row |= {f"val_{name}": value for name, value in val_metrics.items()}
                if state.best_val_loss is None or row["val_loss"] < state.best_val_loss:
                    state.best_step, state.best_val_loss = state.step, row["val_loss"]
            if metrics:  # before the checkpoint: a resume drops rows past its checkpoint, never misses one
                metrics.append(row)
            if state.step % plan.save_every == 0 or last_step or "val_loss" in row or stop_signum is not None:
                save_start, save_cpu = time.perf_counter(), time.process_time()
                state.elapsed_s = time_before + save_start - started
                save_checkpoint(out, model, optimizer, state, plan.method == "lora", ctx)  # every rank; rank 0 writes
                if ctx.is_main:
                    prune_checkpoints(out, plan.keep_checkpoints, state.best_step)
                barrier(ctx)
                saved = {
                    "checkpoint_s": time.perf_counter() - save_start,
                    "checkpoint_cpu_s": time.process_time() - save_cpu,
                }
                row = {**row, **saved}  # for on_step only: how long the checkpoint took
            if on_step:
                on_step(row)
            if stop_signum is not None and not last_step:
                raise TrainingInterrupted(state.step, plan.total_steps, stop_signum, checkpoint_dir(out, state.step))

    return LoopResult(
        steps=state.step,
        best_step=state.best_step,
        best_val_loss=state.best_val_loss,
        final_train_loss=last_loss,
        wall_time_s=time_before + time.perf_counter() - started,
        tokens_processed=tokens_processed,
        allowed_changes=state.allowed_changes,
    )


def _micro_batches_per_rank(step_examples: list[int], lengths: list[int], plan: Plan) -> list[int]:
    return [len(micro_batches(step_examples, lengths, plan.devices, plan.grad_accum, r)) for r in range(plan.devices)]


@torch.no_grad()
def evaluate(
    loss_of,
    objective: Objective,
    examples: Sequence,
    plan: Plan,
    ctx: DistContext,
    batch_examples: int,
    pad_id: int,
    bf16: bool,
    model,
    how: SingleDevice,
) -> tuple[float | None, dict[str, float]]:
    """sum(loss_sum) / sum(normaliser) over the whole validation set, sharded across ranks and reduced; and each
    of the objective's metrics the same way (sum / normaliser)."""
    was_training = model.training
    model.eval()
    mine = sorted(examples[ctx.rank :: ctx.world_size], key=len)
    groups = [mine[i : i + batch_examples] for i in range(0, len(mine), batch_examples)]
    per_rank = lambda: [-(-len(examples[r :: ctx.world_size]) // batch_examples) for r in range(ctx.world_size)]  # noqa: E731
    runs = how.micro_batches_to_run(len(groups), per_rank)
    totals = torch.zeros(2, dtype=torch.float64)  # [sum of loss_sum, sum of normaliser]
    # seeded with the names: a rank without a validation example still reduces the same numbers as the others
    metric_sums: dict = dict.fromkeys(getattr(objective, "metric_names", ()), 0.0)
    for j in range(runs):
        scored = j < len(groups)
        group = groups[j] if scored else list(examples[:1])
        batch = objective.batch(group, plan, pad_id).to(ctx.device)
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss_sum, metrics = loss_of(batch)
        for name, value in metrics.items():  # every rank has the same names; filler batches add zero
            metric_sums[name] = metric_sums.get(name, 0) + value.double().cpu() * (1.0 if scored else 0.0)
        if scored:
            totals[0] += loss_sum.double().cpu()
            totals[1] += objective.normaliser(group)
    names = sorted(metric_sums)
    totals = (
        torch.cat([totals, torch.stack([torch.as_tensor(metric_sums[n], dtype=torch.float64) for n in names])])
        if names
        else totals
    )
    all_reduce_sum(totals, ctx)
    model.train(was_training)
    if totals[1] <= 0:
        return None, {}
    return float(totals[0] / totals[1]), {n: float(v / totals[1]) for n, v in zip(names, totals[2:], strict=True)}


# ============================================================================ export and report


def export_final(model, tokenizer, out: Path, result: LoopResult, plan: Plan) -> tuple[Path, bool]:
    """Write adapter/ or model/ from the best checkpoint (validation on) or the last one."""
    use_best = result.best_step is not None
    source = checkpoint_dir(out, result.best_step if use_best else result.steps)
    is_lora = plan.method == "lora"
    final = out / ("adapter" if is_lora else "model")
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if plan.shard == "full":  # the ranks hold pieces of the model; the checkpoint holds it whole
        copy_weights(source, tmp)
    else:
        load_weights_only(source, model, is_lora)
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final, use_best


def write_model_card(out: Path, final: Path, plan: Plan) -> None:
    """final/README.md: the run's model card (as `finetune export` writes it), in place of PEFT's empty template."""
    from finetune.export.card import model_card
    from finetune.run_folder import locate_weights

    card = model_card(locate_weights(out), "adapter" if plan.method == "lora" else "full")
    (final / "README.md").write_text(card, encoding="utf-8")


def write_run_report(out: Path, plan: Plan, result: LoopResult, final: Path, is_best: bool) -> dict:
    """metrics.jsonl -> diagnosis, loss_curve.png and report.json."""
    rows = read_metrics(out / "metrics.jsonl")
    diagnosis = diagnose_preference(rows) if plan.objective == "dpo" else diagnose(rows, plan.steps_per_epoch)
    plot_loss_curve(rows, out / "loss_curve.png", plan.steps_per_epoch, result.best_step, title=f"{plan.model}")
    report = build_report(
        rows,
        plan,
        diagnosis,
        wall_time_s=result.wall_time_s,
        final_weights=str(final),
        final_is_best=is_best,
        tokens_processed=result.tokens_processed,
        extra={
            "out_dir": str(out),
            "method": plan.method,
            "skipped_lines": plan.data.skipped_lines,
            "resumed_with_changes": result.allowed_changes,
            "objective": plan.objective,
            **preference_summary(rows),
        },
    )
    write_report(report, out / "report.json")
    return report
