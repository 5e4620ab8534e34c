"""Is Auto good? Auto's first run against a hyperparameter sweep and the peers' published LoRA defaults.

    nice -n 10 python bench/auto_sweep.py [--base DIR] [--sizes 40,150,300] [--grid full|smoke]
                                          [--test-prompts 30] [--json bench/auto_sweep.json] [--markdown FILE]

On the pretrained toy base (`finetune toy-model DIR --pretrain`, cached) and for each training-set size
(the first N conversations of examples/train.jsonl), every point is one `finetune train` run through the
library, scored by
- the best validation loss on a fixed held-out set: the last VAL_CONVERSATIONS conversations of
  examples/train.jsonl, never trained on at any size, evaluated by the run itself (Auto's evaluation rhythm,
  the same rule for every point), and
- the house-style rate: the share of the first --test-prompts held-out prompts of examples/test.jsonl whose
  greedy answer by the run's kept weights carries the team's exact greeting and sign-off.

Points: Auto (every value left to Auto), the LoRA defaults of TRL, Unsloth and LLaMA-Factory (PEER_DEFAULTS,
sources in docs/auto.md), and the sweep (SWEEP_GRID: learning rate x epochs x batch, LoRA and full). Every
point uses the same trainer, schedule (cosine, 5% warmup), seed and data; only the named values change.
The script prints one table per size and, at the end, Auto's best validation loss against the sweep's best
(the ratio) and against every peer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EXAMPLES = REPO / "examples"
VAL_CONVERSATIONS = 60
SIZES = (40, 150, 300)  # at most 360 - VAL_CONVERSATIONS


@dataclass(frozen=True)
class Point:
    """One run of the sweep: a name and the RunConfig values it sets (everything else is Auto's)."""

    name: str
    kind: str  # "auto", "peer" or "sweep"
    values: dict = field(default_factory=dict)


# The peers and the hand sweep run as they were measured before Auto's retention mechanisms: no self-replay, the
# adapter kept at full scale (no peer does either); their retention columns show what a hand-tuned run forgets.
AS_BEFORE = {"replay": "off", "adapter_scale": "off"}
FULL = {"method": "full", **AS_BEFORE}
# LoRA as the peers (and most users) train it: the output layer frozen
ADAPTER_ONLY = {"lora_train_head": False, **AS_BEFORE}
# Published defaults for LoRA SFT (docs/auto.md cites each): learning rate, epochs, effective batch, rank, alpha.
PEER_DEFAULTS = (
    Point(
        "TRL defaults",
        "peer",
        {"lr": 2e-5, "epochs": 3, "batch_size": 8, "lora_rank": 8, "lora_alpha": 8.0, **ADAPTER_ONLY},
    ),
    Point(
        "Unsloth defaults",
        "peer",
        {"lr": 2e-4, "epochs": 1, "batch_size": 8, "lora_rank": 16, "lora_alpha": 16.0, **ADAPTER_ONLY},
    ),
    Point(
        "LLaMA-Factory defaults",
        "peer",
        {"lr": 1e-4, "epochs": 3, "batch_size": 8, "lora_rank": 8, "lora_alpha": 16.0, **ADAPTER_ONLY},
    ),
)


# Auto's values without its retention mechanisms (Auto as it was before them); not part of the summary's ratio.
AUTO_BEFORE = Point("Auto without replay or scale", "auto-before", dict(AS_BEFORE))


def sweep_grid(kind: str) -> list[Point]:
    """The points a user would try: LoRA (the adapter only, as LoRA usually trains) at three rates x three
    (epochs, batch) shapes, LoRA with the output layer trained too at three rates, full at three rates. LoRA
    points keep Auto's rank."""
    if kind == "real":  # a real pretrained base: slower (keep it short), its output layer tied (no head points)
        points = [
            Point(f"lora lr {lr:g} e3 b8", "sweep", {"lr": lr, "epochs": 3, "batch_size": 8, **ADAPTER_ONLY})
            for lr in (3e-4, 1e-3, 3e-3, 1e-2)  # 1e-2: 3e-3 was the best at 100 conversations, at the grid's edge
        ]
        return points + [
            Point(f"full lr {lr:g} e3 b8", "sweep", {**FULL, "lr": lr, "epochs": 3, "batch_size": 8})
            for lr in (3e-5, 1e-4)
        ]
    if kind == "smoke":
        return [
            Point("lora lr 1e-3 e1 b8", "sweep", {"lr": 1e-3, "epochs": 1, "batch_size": 8, **ADAPTER_ONLY}),
            Point("full lr 3e-4 e1 b8", "sweep", {**FULL, "lr": 3e-4, "epochs": 1, "batch_size": 8}),
        ]
    points = [
        Point(
            f"lora lr {lr:g} e{epochs} b{batch}",
            "sweep",
            {"lr": lr, "epochs": epochs, "batch_size": batch, **ADAPTER_ONLY},
        )
        for lr in (3e-4, 1e-3, 3e-3)
        for epochs, batch in ((2, 4), (3, 8), (4, 16))
    ]
    points += [
        Point(
            f"lora+head lr {lr:g} e3 b8",
            "sweep",
            {"lr": lr, "epochs": 3, "batch_size": 8, "lora_train_head": True, **AS_BEFORE},
        )
        for lr in (1e-3, 3e-3, 1e-2)
    ]
    points += [
        Point(f"full lr {lr:g} e3 b8", "sweep", {**FULL, "lr": lr, "epochs": 3, "batch_size": 8})
        for lr in (1e-4, 3e-4, 1e-3)
    ]
    return points


def split_examples(
    folder: Path, sizes: tuple[int, ...], val_size: int = VAL_CONVERSATIONS
) -> tuple[dict[int, Path], Path]:
    """Training files of each size (nested: the first N conversations) and the fixed held-out set."""
    lines = (EXAMPLES / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    pool, held_out = lines[:-VAL_CONVERSATIONS], lines[-VAL_CONVERSATIONS:][:val_size]
    if max(sizes) > len(pool):
        raise SystemExit(f"sizes up to {len(pool)} conversations (the rest is the held-out set)")
    val = folder / "val.jsonl"
    val.write_text("".join(held_out), encoding="utf-8")
    files = {}
    for n in sizes:
        files[n] = folder / f"train-{n}.jsonl"
        files[n].write_text("".join(pool[:n]), encoding="utf-8")
    return files, val


def house_style(model_dir: Path, weights: str, prompts, markers: list[str]) -> float:
    from finetune.commands.demo import MAX_NEW_TOKENS
    from finetune.commands.eval import load_tuned
    from finetune.data.tokenize import load_tokenizer
    from finetune.ship.eval.generate import generate_answers, style_rate

    answers = generate_answers(
        load_tuned(str(model_dir), weights), load_tokenizer(str(model_dir)), prompts, MAX_NEW_TOKENS
    )
    return style_rate(answers, markers)


def run_point(
    point: Point, base: Path, data: Path, val: Path, work: Path, prompts, markers, retention: bool = False
) -> dict:
    from finetune.run import train
    from finetune.settings.config import RunConfig

    out = work / "run"
    shutil.rmtree(out, ignore_errors=True)
    config = RunConfig(
        data=str(data), val_file=str(val), model=str(base), out=str(out), keep_checkpoints=1, **point.values
    )
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the library prints nothing; any stray line stays out of the table
        result = train(config)
    report = result.report
    seconds = time.perf_counter() - started
    plan = json.loads((out / "plan.json").read_text())
    row = {
        "name": point.name,
        "kind": point.kind,
        "set": point.values,
        "method": plan.get("method"),
        "lr": plan.get("learning_rate"),
        "epochs": plan.get("epochs"),
        "effective_batch": plan.get("effective_batch"),
        "lora_rank": plan.get("lora_rank") if plan.get("method") == "lora" else None,
        "head": bool(plan.get("lora_train_head")) or plan.get("method") == "full",
        "steps": plan.get("total_steps"),
        "best_val_loss": report["best_val_loss"],
        "house_style": house_style(base, str(result.final_weights), prompts, markers),
        "train_seconds": round(seconds, 1),
        "replay_rows": (plan.get("replay_added") or {}).get("rows", 0),
    }
    scale = report.get("adapter_scale")
    if scale:  # the adapter scale kept after training, and the validation loss of the model kept (at that scale)
        at = {m["alpha"]: m for m in scale.get("measured") or []}
        row["adapter_scale"] = scale["value"]
        row["kept_val_loss"] = (at.get(scale["value"]) or {}).get("val_loss", report["best_val_loss"])
    if retention:  # the retention check on the run's final weights (bench/retention_sweep.py's columns)
        from bench.retention_sweep import retention_row

        row["retention"] = retention_row(out)
    shutil.rmtree(out, ignore_errors=True)
    return row


def summarize(rows: list[dict]) -> dict:
    """Auto against the sweep's best and every peer, by best validation loss (lower is better)."""
    auto = next(r for r in rows if r["kind"] == "auto")
    sweep_best = min((r for r in rows if r["kind"] == "sweep"), key=lambda r: r["best_val_loss"])
    peers = {r["name"]: r["best_val_loss"] for r in rows if r["kind"] == "peer"}  # may be empty (--peers none)
    return {
        "auto_val_loss": auto["best_val_loss"],
        "auto_house_style": auto["house_style"],
        "sweep_best": sweep_best["name"],
        "sweep_best_val_loss": sweep_best["best_val_loss"],
        "ratio": auto["best_val_loss"] / sweep_best["best_val_loss"],
        "within_5_percent": auto["best_val_loss"] <= 1.05 * sweep_best["best_val_loss"],
        "peers": peers,
        "beats_every_peer": all(auto["best_val_loss"] <= v for v in peers.values()),
    }


def _num(x) -> str:
    return "" if x is None else (f"{x:g}" if isinstance(x, float) else str(x))


def markdown(results: dict) -> str:
    lines = []
    for size, block in results["sizes"].items():
        if "summary" not in block:
            continue
        s = block["summary"]
        lines += [
            f"### {size} training conversations",
            "",
            f"Auto: best val loss {s['auto_val_loss']:.4f}, house style {s['auto_house_style']:.0%}; sweep best "
            f"{s['sweep_best_val_loss']:.4f} ({s['sweep_best']}); ratio **{s['ratio']:.3f}**.",
            "",
            "| point | method | lr | epochs | batch | rank | output layer | steps | best val loss | × best | house style | s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(block["rows"], key=lambda r: r["best_val_loss"]):
            name = f"**{r['name']}**" if r["kind"] != "sweep" else r["name"]
            lines.append(
                f"| {name} | {r['method']} | {_num(r['lr'])} | {r['epochs']} | {r['effective_batch']} | "
                f"{_num(r['lora_rank'])} | {'trained' if r.get('head') else 'frozen'} | {r['steps']} | "
                f"{r['best_val_loss']:.4f} | "
                f"{r['best_val_loss'] / s['sweep_best_val_loss']:.3f} | {r['house_style']:.0%} | {r['train_seconds']:.0f} |"
            )
        lines.append("")
    lines += ["### Summary", "", summary_table(results), ""]
    return "\n".join(lines)


def summary_table(results: dict) -> str:
    summaries = {size: block["summary"] for size, block in results["sizes"].items() if "summary" in block}
    if not summaries:
        return "(no size has both Auto and a sweep point: no summary)"
    peers = next(iter(summaries.values()))["peers"]  # the same peers at every size
    head = "| conversations | Auto val loss | sweep best | Auto ÷ best | " + " | ".join(peers) + " | Auto house style |"
    lines = [head, "|" + "---|" * (5 + len(peers))]
    for size, s in summaries.items():
        lines.append(
            f"| {size} | {s['auto_val_loss']:.4f} | {s['sweep_best_val_loss']:.4f} | {s['ratio']:.3f} | "
            + " | ".join(f"{v:.4f}" for v in s["peers"].values())
            + f" | {s['auto_house_style']:.0%} |"
        )
    return "\n".join(lines)


def run_sweep(
    base: Path,
    sizes: tuple[int, ...],
    grid: str,
    test_prompts: int,
    peers: bool = True,
    val_size: int = VAL_CONVERSATIONS,
    save=None,
    log=print,
    done: dict | None = None,
    only: tuple[str, ...] = (),
    retention: bool = False,
) -> dict:
    """Every point at every size; `save(results)` after each point, so an interrupted sweep keeps what it ran
    (`done`: such results, whose points are kept and not run again)."""
    from finetune.data.read import read_file

    style = json.loads((EXAMPLES / "house_style.json").read_text())
    markers = [style["greeting"], style["sign_off"]]
    prompts = read_file(str(EXAMPLES / "test.jsonl")).conversations[:test_prompts]
    before = (AUTO_BEFORE,) if retention else ()  # the retention columns compare Auto with and without its mechanisms
    points = [Point("Auto", "auto"), *before, *(PEER_DEFAULTS if peers else ()), *sweep_grid(grid)]
    if only:
        unknown = set(only) - {p.name for p in points}
        if unknown:
            raise SystemExit(
                f"no such point: {', '.join(sorted(unknown))} (points: {', '.join(p.name for p in points)})"
            )
        points = [p for p in points if p.name in only]
    earlier = (done or {}).get("sizes", {})
    # what an earlier run measured stays in the file while this one runs (a size not reached yet, a point not asked)
    results: dict = {"base": str(base), "grid": grid, "test_prompts": len(prompts), "sizes": dict(earlier)}
    with tempfile.TemporaryDirectory(prefix="auto-sweep-") as tmp:
        work = Path(tmp)
        files, val = split_examples(work, sizes, val_size)
        for n in sizes:
            kept = {r["name"]: r for r in earlier.get(str(n), {}).get("rows", [])}
            rows: list[dict] = [r for name, r in kept.items() if name not in {p.name for p in points}]
            results["sizes"][str(n)] = {"rows": rows}
            for point in points:
                rows.append(
                    kept.get(point.name)
                    or run_point(point, base, files[n], val, work, prompts, markers, retention=retention)
                )
                if save:
                    save(results)
                r = rows[-1]
                log(
                    f"{n:>4} conversations  {point.name:<26} lr {_num(r['lr']):<8} epochs {r['epochs']} "
                    f"batch {r['effective_batch']:<3} best val {r['best_val_loss']:.4f}  "
                    f"house style {r['house_style']:.0%}  ({r['train_seconds']:.0f} s)"
                )
            if not {"auto", "sweep"} <= {r["kind"] for r in rows}:  # --points without Auto or any sweep point
                continue
            results["sizes"][str(n)]["summary"] = summarize(rows)
            s = results["sizes"][str(n)]["summary"]
            log(
                f"{n:>4} conversations: Auto {s['auto_val_loss']:.4f}, sweep best {s['sweep_best_val_loss']:.4f} "
                f"({s['sweep_best']}), ratio {s['ratio']:.3f}; peers "
                + ", ".join(f"{k} {v:.4f}" for k, v in s["peers"].items())
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--base", default=None,
        help="a model folder, .gguf or pulled base name (default: the cached pretrained toy base, built if needed)",
    )  # fmt: skip
    parser.add_argument("--resume", default=None, metavar="JSON", help="keep the points an earlier --json holds")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="training-set sizes, comma-separated")
    parser.add_argument(
        "--grid", choices=["full", "real", "smoke"], default="full",
        help="full: the toy's 15 points; real: 6 points for a real base (slower); smoke: two",
    )  # fmt: skip
    parser.add_argument("--peers", choices=["all", "none"], default="all", help="score the peers' defaults too")
    parser.add_argument("--test-prompts", type=int, default=30, help="held-out prompts for the house-style rate")
    parser.add_argument("--val", type=int, default=VAL_CONVERSATIONS, help="held-out conversations (fewer: faster)")
    parser.add_argument(
        "--points", default="", help="run only these points, by name, comma-separated (e.g. 'Auto,TRL defaults')"
    )
    parser.add_argument("--retention", action="store_true", help="run the retention check on each point (slower)")
    parser.add_argument("--json", default=None, help="write every run's numbers here")
    parser.add_argument("--markdown", default=None, help="write the result tables here")
    args = parser.parse_args(argv)

    from finetune.models.source import resolve_model
    from finetune.ship.toy import pretrained_base

    base = Path(resolve_model(args.base)) if args.base else pretrained_base(log=print)[0]
    done = json.loads(Path(args.resume).read_text()) if args.resume else None
    sizes = tuple(int(s) for s in args.sizes.split(","))
    started = time.perf_counter()

    def save(results: dict) -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))

    results = run_sweep(
        base,
        sizes,
        args.grid,
        args.test_prompts,
        peers=args.peers == "all",
        val_size=args.val,
        save=save,
        done=done,
        only=tuple(name.strip() for name in args.points.split(",") if name.strip()),
        retention=args.retention,
    )
    results["seconds"] = round(time.perf_counter() - started)
    save(results)
    print(summary_table(results))
    if args.markdown:
        Path(args.markdown).write_text(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
