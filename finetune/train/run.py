"""One training run, end to end: data -> plan -> model -> loop -> final weights -> report.

    from finetune import RunConfig, train
    report = train(RunConfig(data="train.jsonl", model="path/to/model", out="runs/one"))

Outputs (OUT = config.out): plan.json, metrics.jsonl, loss_curve.png, report.json, checkpoints/,
and adapter/ (LoRA, PEFT format) or model/ (full, save_pretrained). Only rank 0 writes them.

Under torchrun (`finetune train --devices N`, see launch.py and docs/distributed.md) every process runs
this same function; a failure on one rank is recorded for the launcher with that rank's number.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from finetune.config import RunConfig
from finetune.data.prepare import PreparedData, prepare_data
from finetune.data.tokenize import load_tokenizer
from finetune.errors import UserError
from finetune.plan.model_facts import load_model_facts
from finetune.plan.plan import Plan, build_plan
from finetune.report.diagnosis import diagnose
from finetune.report.metrics import read_metrics
from finetune.report.plot import plot_loss_curve
from finetune.report.summary import build_report, write_report
from finetune.train.checkpoint import checkpoint_dir, copy_weights, list_checkpoints, load_weights_only, read_state
from finetune.train.distributed import DistContext, barrier, init_distributed, rank_failures, shutdown
from finetune.train.loop import LoopResult, LoopSettings, TrainingInterrupted, train_loop
from finetune.train.loss import use_varlen_attention
from finetune.train.model import add_lora, enable_gradient_checkpointing, load_model
from finetune.train.progress import ProgressReporter

RUN_FILES = ("plan.json", "metrics.jsonl", "report.json", "checkpoints", "adapter", "model")


def _check_out_dir(out: Path, resume: bool) -> None:
    """Never overwrite a previous run by accident."""
    taken = [name for name in RUN_FILES if (out / name).exists()]
    if resume and not list_checkpoints(out):
        raise UserError(f"--resume: {out} holds no checkpoint to resume from")
    if taken and not resume:
        raise UserError(
            f"{out} already holds a run ({', '.join(taken)}); pass --resume to continue it, or choose another --out"
        )


def _use_bf16(config: RunConfig, device: torch.device) -> bool:
    if config.dtype == "bf16":
        return True
    # fp32 on the CPU by default: bf16 changes numerics, and the equivalence tests run in fp32
    return config.dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()


def loop_settings(plan: Plan, config: RunConfig, pad_id: int, bf16: bool) -> LoopSettings:
    return LoopSettings(
        total_steps=plan.total_steps,
        steps_per_epoch=plan.steps_per_epoch,
        grad_accum=plan.grad_accum,
        devices=plan.devices,
        effective_batch=plan.effective_batch,
        learning_rate=plan.learning_rate,
        warmup_steps=plan.warmup_steps,
        schedule=plan.schedule,
        last_batch=plan.last_batch,
        eval_every=plan.eval_every,
        save_every=plan.save_every,
        keep_checkpoints=config.keep_checkpoints,
        seed=config.seed,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        max_seq_len=config.max_seq_len,
        packing=config.packing,
        bf16=bf16,
        is_lora=config.method == "lora",
        resume=config.resume,
        pad_id=pad_id,
        shard=plan.shard,
    )


def _export_final(
    model, tokenizer, out: Path, result: LoopResult, is_lora: bool, sharded: bool = False
) -> tuple[Path, bool]:
    """Write adapter/ or model/ from the best checkpoint (validation on) or the last one."""
    use_best = result.best_step is not None
    source = checkpoint_dir(out, result.best_step if use_best else result.steps)
    final = out / ("adapter" if is_lora else "model")
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if sharded:  # the ranks hold pieces of the model; the checkpoint holds it whole
        copy_weights(source, tmp)
    else:
        load_weights_only(source, model, is_lora)
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final, use_best


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


def run_training(
    config: RunConfig,
    on_step: Callable[[dict], None] | None = None,
    show: Callable[[str], None] | None = print,
    ctx: DistContext | None = None,
) -> dict:
    """Plan, train and report one run; returns report.json's content (on rank 0; {} on other ranks)."""
    if not config.data:
        raise UserError("no training file: pass DATA.jsonl (or `data:` in --config)")
    if not config.model:
        raise UserError("no model: pass --model (a hub id or a local folder)")
    if not config.out:
        raise UserError("no output folder: pass --out DIR")
    joined = ctx is None
    ctx = ctx or init_distributed()
    if config.gpu is None and ctx.device.type == "cpu":
        config = dataclasses.replace(config, gpu="cpu")  # size time and memory for the machine we are on
    with rank_failures(ctx, passthrough=(TrainingInterrupted,)):  # every rank stops alike: no rank to name
        report = _run_training(config, on_step, show, ctx)
    if joined:
        shutdown(ctx)
    return report


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


def _run_training(
    config: RunConfig, on_step: Callable[[dict], None] | None, show: Callable[[str], None] | None, ctx: DistContext
) -> dict:
    out = Path(config.out)
    say = show if (show and ctx.is_main) else (lambda _: None)
    if ctx.is_main:
        _check_out_dir(out, config.resume)

    # ---- data and plan
    tokenizer = load_tokenizer(config.model, config.trust_remote_code)
    prepared = _prepare_on_every_rank(config, tokenizer, ctx)
    if prepared.from_cache:
        say(f"tokenized data read from the token cache ({prepared.cache_entry})")
    plan = build_plan(config, prepared.facts, load_model_facts(config.model), data_warnings=prepared.warnings)
    if plan.devices != ctx.world_size:
        raise UserError(f"the plan is for {plan.devices} device(s) but {ctx.world_size} process(es) are running")
    if ctx.is_main:
        from finetune.plan.render import render_plan

        render_plan(plan)
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2))

    # ---- model
    model = load_model(config.model, torch.float32, config.trust_remote_code)
    if config.packing:
        use_varlen_attention(model)  # packed records run as one row, attention record by record: no filler, no mask
    is_lora = config.method == "lora"
    if is_lora:
        model = add_lora(model, plan.lora_rank, plan.lora_alpha, config.lora_dropout, config.seed)
    if plan.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    torch.manual_seed(config.seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    settings = loop_settings(plan, config, pad_id, _use_bf16(config, ctx.device))

    # ---- train
    if config.resume and ctx.is_main and (note := _resume_note(out, plan.devices)):
        say(f"note: {note}")
    say(f"training {plan.total_steps} steps; outputs in {out}")
    first_step = int(list_checkpoints(out)[-1].name.split("-")[-1]) if config.resume else 0
    with ProgressReporter(plan.total_steps, first_step) if (show and ctx.is_main) else nullcontext() as progress:

        def report_step(row: dict) -> None:
            if progress:
                progress(row)
            if on_step:
                on_step(row)

        result = train_loop(model, prepared.train, prepared.val, settings, out, ctx, on_step=report_step)
    if not ctx.is_main:
        return {}

    # ---- outputs
    final, is_best = _export_final(model, tokenizer, out, result, is_lora, sharded=plan.shard == "full")
    rows = read_metrics(out / "metrics.jsonl")
    diagnosis = diagnose(rows, plan.steps_per_epoch)
    plot_loss_curve(rows, out / "loss_curve.png", plan.steps_per_epoch, result.best_step, title=f"{config.model}")
    report = build_report(
        rows,
        plan.to_dict(),
        diagnosis,
        wall_time_s=result.wall_time_s,
        final_weights=str(final),
        final_is_best=is_best,
        tokens_processed=result.tokens_processed,
        extra={"out_dir": str(out), "method": config.method},
    )
    write_report(report, out / "report.json")
    return report
