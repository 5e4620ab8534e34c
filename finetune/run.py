"""A run, top to bottom: hold out the test set -> prepare -> plan -> loop -> export -> report -> card.

    from finetune import RunConfig, train
    result = train(RunConfig(data="train.jsonl", model="path/to/model", out="runs/one"))
    result.report["final_val_loss"], result.plan.total_steps, result.final_weights

The command line (`finetune train`), the library call and every service job walk this one spine. Its first
half, `plan_run` (test set, data, plan), is also all that `finetune plan` and the service's worker do: the
worker plans a job once, writes the plan, and the trainer it starts executes that plan (`train(config,
plan=...)`, `finetune train --plan FILE`) instead of planning again, after checking that the data and the
code are the ones the plan was made from.

Outputs (OUT = config.out): plan.json, metrics.jsonl, loss_curve.png, report.json, checkpoints/, and adapter/
(LoRA) or model/ (full), each with its model card. Only rank 0 writes them. The library call prints nothing:
`on_plan(plan)` and `on_step(row)` let a caller show the plan and progress; notes go to the `finetune` logger.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.bucket.inputs import INPUT_SETTINGS, local_inputs, read_text
from finetune.data.arrays import record_lengths
from finetune.data.dispatch import prepare
from finetune.data.prepare import scanned_users_files
from finetune.data.replay_mix import billed_flags, replay_on
from finetune.data.skipped import write_skipped
from finetune.data.team_context import bind_team_system
from finetune.data.tokenize import load_tokenizer
from finetune.models.facts import load_model_facts
from finetune.models.source import model_name, resolve_model
from finetune.placement.stages import recorded_in, stage
from finetune.placement.where import of_plan
from finetune.plan.build import build_plan
from finetune.plan.plan import Plan
from finetune.report.metrics import read_metrics
from finetune.report.plot import plot_loss_curve
from finetune.report.summary import build_report, write_report
from finetune.settings.config import RunConfig
from finetune.settings.errors import UserError
from finetune.settings.fingerprint import run_fingerprint
from finetune.settings.version import code_version
from finetune.settings.wording import ref, render
from finetune.ship.eval.replay_preview import PendingReplay, as_given, is_pending, pending_replay, with_replay
from finetune.ship.eval.test_split import held_out_lines, hold_out_test
from finetune.ship.export.card import model_card
from finetune.ship.run_folder import locate_weights
from finetune.track import Trackers, start_trackers
from finetune.train.billed import checked_bill, planned_bill, replay_tokens_trained, team_lengths
from finetune.train.order import schedule_tokens
from finetune.train.speed import local_device_kind, planned_speed, remember_speed

if TYPE_CHECKING:  # types only: the training half's modules load torch, which planning alone never needs
    from finetune.models.facts import ModelFacts
    from finetune.train.distributed import DistContext
    from finetune.train.loop import LoopResult
    from finetune.train.objective import Objective

log = logging.getLogger("finetune")
RUN_FILES = ("plan.json", "metrics.jsonl", "report.json", "checkpoints", "adapter", "model")


@dataclass
class TrainResult:
    """What `finetune.train(config)` returns (on rank 0; other ranks get `report == {}`)."""

    out_dir: Path
    plan: Plan
    report: dict  # the content of report.json
    final_weights: Path | None  # OUT/adapter or OUT/model
    loop: LoopResult | None


@dataclass
class PlannedRun:
    """The first half of a run: the config as it runs (its data may now be OUT/train.jsonl), the data, the plan."""

    config: RunConfig
    tokenizer: object
    prepared: object  # PreparedData (supervised) or PreparedPairs (preference tuning)
    plan: Plan
    general_val: object = None  # the forgetting curve's records (general_val on), else None


# ============================================================================ the spine


def _run(config: RunConfig, plan: Plan | None, on_plan, on_step, objective: Objective | None, ctx) -> TrainResult:
    from finetune.ship.adapter_scale import scale_adapter  # torch: only a run that trains needs it
    from finetune.train import guards  # torch: as above
    from finetune.train.final import write_final_weights  # torch: as above
    from finetune.train.loop import train_loop  # torch: as above
    from finetune.train.model import model_for  # torch: as above
    from finetune.train.objective import objective_for  # torch: as above

    out = Path(config.out)
    _open_out_folder(out, config.resume, ctx)  # never overwrite a run; a resume sets damaged checkpoints aside
    # no speed is measured here: that would load the model a second time; this run's own steps are remembered
    planned = plan_run(config, out, ctx, measure=False) if plan is None else _executing(plan, config, ctx)
    plan = planned.plan
    if plan.devices != ctx.world_size:
        raise UserError(f"the plan is for {plan.devices} device(s) but {ctx.world_size} process(es) are running")
    if config.resume and (finished := guards.finished_report(out, plan.total_steps)) is not None:
        if ctx.is_main:  # every rank sees the same files: all stop here, and nothing is written
            log.warning("%s", render(guards.finished_message(out, finished)))
        return TrainResult(out, plan, finished if ctx.is_main else {}, Path(finished["final_weights"]), None)
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2))
        write_skipped(out, planned.prepared.skipped)
        if on_plan:
            on_plan(plan)
    trackers = start_trackers(plan.run, plan) if ctx.is_main else Trackers()  # report_to (finetune/track)

    placement = of_plan(plan, ctx.device)  # every model of the run: this device, the plan's precision
    model = model_for(plan, ctx.device, len(planned.tokenizer), placement)  # (+ the LoRA adapter, trained in fp32)
    objective = objective or objective_for(plan)
    pad_id = planned.tokenizer.pad_token_id if planned.tokenizer.pad_token_id is not None else 0
    examples = [*planned.prepared.train, *planned.prepared.val]
    objective.before_training(model, examples, ctx.device, pad_id, placement.autocast)
    if config.resume and ctx.is_main and (note := _resume_note(out, plan.devices)):
        log.info("note: %s", render(note))
    log.info("training %d steps; outputs in %s", plan.total_steps, out)
    with stage("training") as seen:
        result = train_loop(
            model, planned.prepared.train, planned.prepared.val, plan, out, ctx,
            objective=objective, pad_id=pad_id, resume=config.resume, on_step=trackers.chain(on_step),
            fingerprint=run_fingerprint(plan), allow_changes=config.allow_changes,
            general_val=planned.general_val or (), billed=billed_flags(planned.prepared.train, plan.replay_added),
        )  # fmt: skip
        seen.model(model)
    if not ctx.is_main:
        return TrainResult(out, plan, {}, None, result)

    final = write_final_weights(
        model, planned.tokenizer, out, result.best_step, result.steps, plan
    )  # adapter/ or model/
    with stage("adapter scale") as seen:
        seen.model(model)
        scale = scale_adapter(
            model, planned.tokenizer, plan, objective, planned.prepared.val, pad_id, final, ctx.device,
            placement.autocast,
        )  # fmt: skip  # adapter_scale (ship/adapter_scale.py): None when off, and the adapter stays as written
    bill = checked_bill(planned.prepared.train, plan, result.steps, result.tokens_billed, result.tokens_processed)
    report = write_run_report(out, plan, result, final, objective, scale, bill)  # report.json, loss_curve.png
    kind = "adapter" if plan.method == "lora" else "full"
    (final / "README.md").write_text(model_card(locate_weights(out), kind), encoding="utf-8")  # the model card
    trackers.finish(out, report)  # report_to: the report, loss curve and card; waits a few seconds at most
    remember_speed(out, plan, planned.prepared.summary, ctx.device)
    return TrainResult(out, plan, report, final, result)


def plan_run(
    config: RunConfig,
    out: Path | None = None,
    ctx: DistContext | None = None,
    measure: bool = True,
    speed_of: Callable[[str, str, int], float | None] | None = None,
) -> PlannedRun:
    """Hold out the test set (into `out`), prepare the data, plan: what `finetune plan` and the worker do.
    `ctx`: this process's place in a run of several (None: one process that plans). `measure`: when this machine
    knows no speed for the model, time a few training steps of it (loads the model; cached); False: the known
    speed or the FLOP-based guess, and no torch import unless the plan's device must be found or replay generates.
    `speed_of(model, trained_weights, seq_len)`: the speed of the machine the run will train on, when it is
    another one (the service's API planning for its workers)."""
    if config.gpu is None:  # size memory and time for the machine the run is planned on
        config = dataclasses.replace(config, gpu=local_device_kind(ctx.device if ctx else None))
    config = dataclasses.replace(config, **local_inputs({n: getattr(config, n) for n in INPUT_SETTINGS}))  # s3://…
    given = config  # the user's own files: a copy the run reads is named by them
    if config.test_fraction and out is not None:
        config = hold_out_test(config, out)  # before the split and the plan: the test set is never trained on
    config = dataclasses.replace(config, model=resolve_model(config.model)) if config.model else config
    tokenizer = load_tokenizer(config.model, config.trust_remote_code, config.chat_template) if config.model else None
    facts = load_model_facts(config.model)  # once: the data's Auto limit and the plan read the same facts
    config = bind_team_system(config, out, _is_main(ctx), lambda: _wait_for_every_rank(ctx))  # OUT/team/ (unset: as is)
    config, mixed = _replayed(config, out, tokenizer, ctx, facts)  # self-replay (off: nothing changes)
    prepared = _prepare_on_every_rank(config, tokenizer, ctx, facts)
    if config.data != given.data or (mixed and given.general_data):  # a copy (test split, replay mix): its values
        prepared.summary = _found_in_given_files(prepared.summary, given, out, mixed)  # named by the user's files
    if prepared.from_cache and _is_main(ctx):
        log.info("tokenized data read from the token cache (%s)", prepared.cache_entry)
    lengths = record_lengths(prepared.train)
    if isinstance(mixed, PendingReplay):  # no output folder: the replay rows counted into the data, none generated
        prepared.summary, lengths, team, team_count = mixed.counted(prepared.summary, lengths, config)
    else:
        team, team_count = team_lengths(prepared.train, mixed)  # a replay row: 0 (the base's answers are not billed)
    plan = build_plan(
        config,
        prepared.summary,
        facts,
        step_tokens=lambda effective, steps: schedule_tokens(  # called only when a run reads part of its records
            lengths, effective, config.seed, config.last_batch, steps
        ),
        speed=planned_speed(config, prepared.summary, ctx.device if ctx else None, measure, speed_of) if config.model else None,
        billed=planned_bill(lengths, team, team_count, mixed, config) if mixed else None,
    )  # fmt: skip
    replay_trained = replay_tokens_trained(lengths, team, plan) if mixed else None
    plan = with_replay(plan, mixed, config, facts.total_params if facts else None, sum(team), replay_trained)
    plan, general = _general_val(plan, tokenizer, ctx, generate=out is not None)  # the forgetting curve (off: nothing)
    return PlannedRun(config, tokenizer, prepared, plan, general)


def _replayed(config: RunConfig, out: Path | None, tokenizer, ctx: DistContext | None, facts):
    """The config reading the team's data with replay rows mixed in (rank 0 writes the files), and what was added."""
    params = facts.total_params if facts else None
    if not replay_on(config, params):
        return config, None
    if out is None:  # a plan that trains nothing: the rows counted, no model loaded (ship/eval/replay_preview.py)
        return config, pending_replay(config, tokenizer, params)
    from finetune.ship.eval.replay import mix_replay  # torch: replay generates its rows with the base model

    mixed, failure = None, None
    if _is_main(ctx):
        try:
            mixed = mix_replay(config, out, tokenizer, total_params=params)
        except Exception as exc:  # the others must not wait for it forever
            failure = exc
    _wait_for_every_rank(ctx)
    if failure is not None:
        raise failure
    mixed = mixed or mix_replay(
        config, out, tokenizer, write=False, total_params=params
    )  # another rank: rank 0's files
    return mixed.config, mixed


def _found_in_given_files(summary, given: RunConfig, out: Path | None, mixed):
    """The data's summary with the sensitive values named as found in the user's files (less the test split), the
    general conversations replay mixed in included, and the invented specifics of the team's own replies: the copies'
    names and lines mean nothing to the user."""
    held = held_out_lines(out) if given.test_fraction and out is not None else set()
    general = given.general_data if mixed is not None else None
    sensitive_found, invented_specifics = scanned_users_files(given, held, general)
    return dataclasses.replace(summary, sensitive_found=sensitive_found, invented_specifics=invented_specifics)


def _general_val(plan: Plan, tokenizer, ctx: DistContext | None, generate: bool = True) -> tuple[Plan, object]:
    """The forgetting curve's records (held-out general prompts answered by the base), and the plan saying what
    they cost; off (or a plan without a model): the plan as it is, and None. `generate` False: counted (None)."""
    if not plan.general_val or tokenizer is None:
        return plan, None
    from finetune.ship.eval.general_val import counted_set, general_val_set  # torch: the base answers the prompts

    records, about = general_val_set(plan, tokenizer, ctx) if generate else (None, counted_set(plan, tokenizer))
    return dataclasses.replace(plan, general_val_set=about), records


# ============================================================================ the entry point


def train(
    config: RunConfig,
    on_plan: Callable[[Plan], None] | None = None,
    on_step: Callable[[dict], None] | None = None,
    objective: Objective | None = None,
    ctx: DistContext | None = None,
    plan: Plan | None = None,
) -> TrainResult:
    """Plan (or execute the given `plan`), train, export and report one run. Prints nothing; see the docstring."""
    from finetune.train import guards  # torch: only a run that trains needs it
    from finetune.train.distributed import init_distributed, rank_failures, shutdown  # torch: as above
    from finetune.train.loop import TrainingInterrupted  # torch: as above
    from finetune.train.remote_run import open_remote_run  # torch (train's checkpoints): as above

    config.check_required("train")
    joined = ctx is None
    ctx = ctx or init_distributed()
    # --out s3://…: the run writes a node-local copy, mirrored to the bucket (train/remote_run.py); None: a folder
    remote = open_remote_run(config.out, config.resume, ctx.rank, RUN_FILES)
    if remote is not None:
        config = dataclasses.replace(config, out=str(remote.local))
        on_plan, on_step = remote.chain(on_plan, on_step) if ctx.is_main else (on_plan, on_step)
    if ctx.is_main:
        guards.check_out_folder(Path(config.out))  # before anything slow: the model may be minutes of download away
    try:
        with rank_failures(ctx, passthrough=(TrainingInterrupted,)):  # every rank stops alike: no rank to name
            try:
                with recorded_in(Path(config.out) if ctx.is_main else None):  # OUT/stages.jsonl: where each ran
                    result = _run(config, plan, on_plan, on_step, objective, ctx)
                _wait_for_every_rank(ctx)  # all leave together: none tears down its process group while rank 0 writes
                if remote is not None and result.report:
                    result = dataclasses.replace(result, report=remote.finish(result.report))
                return result
            except OSError as exc:
                if (full := guards.disk_full_error(exc, Path(config.out))) is not None:
                    raise full from None
                raise
    finally:
        if remote is not None:
            remote.close()
        if joined:
            shutdown(ctx)


def load_plan(path: str | Path, out: str, resume: bool = False, allow_changes: str | None = None) -> Plan:
    """A plan.json made by `finetune plan --json` or the service's worker, to execute into `out`."""
    try:
        document = json.loads(read_text(path))  # a file, or an object of a bucket (a job's plan on a cluster)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the plan ({exc})") from None
    plan = Plan.from_dict(document, out=out, resume=resume, allow_changes=allow_changes)
    if plan.code_version != code_version():
        raise UserError(
            f"{path} was made by finetune {plan.code_version}, this is {code_version()}: plan again with this version"
        )
    return plan


# ============================================================================ the steps' details


def _executing(plan: Plan, config: RunConfig, ctx: DistContext) -> PlannedRun:
    """The given plan's data, prepared again (from the token cache), after checking it is the data planned on. A plan
    made without an output folder, with replay rows the base had not answered, is completed first: planned again here
    with their answers, Auto choosing again (a worker's plan and a run's own never are)."""
    if is_pending(plan):
        return _completed(plan, config, ctx)
    run = dataclasses.replace(plan.run, out=config.out, resume=config.resume, allow_changes=config.allow_changes)
    run = dataclasses.replace(run, **local_inputs({n: getattr(run, n) for n in INPUT_SETTINGS}, run.out))  # s3://…
    tokenizer = load_tokenizer(run.model, run.trust_remote_code, run.chat_template)
    prepared = _prepare_on_every_rank(run, tokenizer, ctx, plan.model_facts)
    for name, planned, now in (
        ("training file", plan.data.data_sha256, prepared.summary.data_sha256),
        ("validation file", plan.data.val_sha256, prepared.summary.val_sha256),
    ):
        if planned != now:
            raise UserError(
                f"the {name} changed since the plan was made (sha256 {str(planned)[:12]} then, {str(now)[:12]} "
                "now): plan the run again"
            )
    if prepared.summary.examples != plan.data.examples:
        raise UserError("the data prepares into other records than the plan's: plan the run again")
    plan = dataclasses.replace(plan, run=run)
    return PlannedRun(run, tokenizer, prepared, plan, _general_val(plan, tokenizer, ctx)[1])  # the plan says its cost


def _completed(preview: Plan, config: RunConfig, ctx: DistContext) -> PlannedRun:
    planned = plan_run(as_given(preview, config), Path(config.out), ctx, measure=False)
    if planned.plan.total_steps != preview.total_steps and _is_main(ctx):  # the replay rows' lengths moved a choice
        log.warning("the plan counted %d steps; with the base's answers the run takes %d (plan.json has them)",
                    preview.total_steps, planned.plan.total_steps)  # fmt: skip
    return planned


def _prepare_on_every_rank(config: RunConfig, tokenizer, ctx: DistContext | None, facts: ModelFacts | None):
    """Rank 0 tokenizes (on every core) and fills the token cache; the other ranks then read the cache."""
    if ctx is None or not ctx.distributed or not config.cache:
        return prepare(config, tokenizer, workers=None if _is_main(ctx) else 1, facts=facts)
    prepared, failure = None, None
    if ctx.is_main:
        try:
            prepared = prepare(config, tokenizer, facts=facts)
        except Exception as exc:  # the others must not wait for it forever: they fail the same way on their own
            failure = exc
    _wait_for_every_rank(ctx)
    if failure is not None:
        raise failure
    return prepared or prepare(config, tokenizer, workers=1, facts=facts)


def _is_main(ctx: DistContext | None) -> bool:
    """Whether this process writes (rank 0, or the one process that plans)."""
    return ctx is None or ctx.is_main


def _wait_for_every_rank(ctx: DistContext | None) -> None:
    """A barrier across the run's processes; nothing to wait for (and no torch import) in one process."""
    if ctx is not None and ctx.distributed:
        from finetune.train.distributed import barrier  # torch: loaded already by a run of several processes

        barrier(ctx)


def _open_out_folder(out: Path, resume: bool, ctx: DistContext) -> None:
    """Never overwrite a previous run by accident; remove what a crash left half-written; on resume, say what was
    found and set damaged checkpoints aside (before any rank looks for the newest one)."""
    # torch: only a run that trains needs it
    from finetune.train.checkpoint import find_resume_point, remove_stale_tmp, set_aside_damaged

    if ctx.is_main:
        taken = [name for name in RUN_FILES if (out / name).exists()]
        if taken and not resume:
            raise UserError(
                f"{out} already holds a run ({', '.join(taken)}); pass {ref('resume')} to continue it, or choose "
                f"another {ref('out')}"
            )
        remove_stale_tmp(out)
        if resume:
            point = find_resume_point(out)
            if message := point.message(out):
                log.warning("%s", render(message))
            set_aside_damaged(point)
    _wait_for_every_rank(ctx)


def _resume_note(out: Path, devices: int) -> str | None:
    """What resuming on another device count means (the loop allows it)."""
    from finetune.train.checkpoint import list_checkpoints, read_state  # torch: only a run that trains needs it

    found = list_checkpoints(out)
    before = read_state(found[-1]).shape.get("devices") if found else None
    if before in (None, devices):
        return None
    return (
        f"resuming on {devices} device(s) a run checkpointed on {before}: every step keeps its records, so the "
        "weights equal an uninterrupted run's up to float rounding (with LoRA dropout on, the masks differ)"
    )


def write_run_report(
    out: Path, plan: Plan, result: LoopResult, final: Path, objective: Objective, adapter_scale: dict | None = None,
    bill: dict | None = None,
) -> dict:  # fmt: skip
    """metrics.jsonl -> the objective's diagnosis, loss_curve.png and report.json (with the adapter's scale, when
    adapter_scale is on). `bill`: what was billed (train/billed.checked_bill; None: what the loop counted)."""
    rows = read_metrics(out / "metrics.jsonl")
    plot_loss_curve(rows, out / "loss_curve.png", plan.steps_per_epoch, result.best_step, title=model_name(plan.model))
    report = build_report(
        rows,
        plan,
        objective.diagnose(rows, plan),
        wall_time_s=result.wall_time_s,
        final_weights=str(final),
        final_is_best=result.best_step is not None,
        tokens_processed=result.tokens_billed,
        tokens_trained=result.tokens_processed,
        bill=bill,
        extra={
            "out_dir": str(out),
            "method": plan.method,
            "skipped_lines": plan.data.skipped_lines,
            "resumed_with_changes": result.allowed_changes,
            "objective": plan.objective,
            **objective.summary(rows),
            **({} if adapter_scale is None else {"adapter_scale": adapter_scale}),
        },
    )
    write_report(report, out / "report.json")
    return report
