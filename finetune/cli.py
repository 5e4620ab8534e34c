"""The command line: one thin function per command, no logic.

finetune toy-model DIR [--data FILE] [--pretrain]
finetune validate FILE [--model DIR] [--show N] [--json]
finetune plan DATA.jsonl [--model M] ... [--json]      |   finetune plan --examples N [--tokens T] ...
finetune train DATA.jsonl --model M --out DIR [...]    |   finetune train --config run.yaml
finetune demo [--out DIR] [--base DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from finetune.config import AUTO, RunConfig
from finetune.errors import UserError

# ----------------------------------------------------------------------------- argument types


def _auto_or_int(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'auto', got {text!r}") from None


def _auto_or_float(text: str) -> float | str:
    if text == AUTO:
        return AUTO
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def _auto_or_bool(text: str) -> bool | str:
    lowered = text.lower()
    if lowered == AUTO:
        return AUTO
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected on, off or auto, got {text!r}")


def _add_run_flags(p: argparse.ArgumentParser, training: bool) -> None:
    """The knobs shared by `plan` and `train` (same names, same Auto). Defaults come from RunConfig."""
    s = argparse.SUPPRESS  # only flags the user gives override RunConfig (or the YAML file)
    p.add_argument("--model", default=s, help="hub id or local model folder")
    p.add_argument("--method", choices=["lora", "full"], default=s, help="LoRA adapter or full fine-tuning")
    p.add_argument("--epochs", type=_auto_or_int, default=s, help="passes over the data, or auto")
    p.add_argument("--batch-size", type=_auto_or_int, default=s, help="records per micro-batch per device, or auto")
    p.add_argument("--grad-accum", type=int, default=s, help="micro-batches per optimizer step")
    p.add_argument("--devices", type=int, default=s, help="devices (processes) training together")
    p.add_argument("--lr", type=_auto_or_float, default=s, help="peak learning rate, or auto")
    p.add_argument("--warmup-ratio", type=float, default=s, help="share of steps for warmup (default 0.05)")
    p.add_argument("--warmup-steps", type=int, default=s, help="warmup in steps (overrides --warmup-ratio)")
    p.add_argument("--lora-rank", type=_auto_or_int, default=s, help="LoRA rank, or auto")
    p.add_argument("--lora-alpha", type=_auto_or_float, default=s, help="LoRA alpha (auto = 2 x rank)")
    p.add_argument("--max-seq-len", type=int, default=s, help="longest record in tokens (default 1024)")
    p.add_argument("--truncation", choices=["left", "drop"], default=s, help="over-long records: cut context or drop")
    p.add_argument("--record-policy", choices=["all", "last", "each"], default=s, help="which replies are targets")
    p.add_argument("--last-batch", choices=["keep", "drop"], default=s, help="keep or drop a partial last batch")
    p.add_argument("--val-fraction", type=_auto_or_float, default=s, help="held-out share (0 = none), or auto")
    p.add_argument("--val-file", default=s, help="use this file as the validation set")
    p.add_argument("--seed", type=int, default=s, help="seed for split, shuffling and init (default 0)")
    p.add_argument("--price-per-million-tokens", type=float, default=s, help="price per 1M tokens processed")
    p.add_argument("--gpu-hour-price", type=float, default=s, help="price of one device-hour")
    p.add_argument("--gpu", default=s, help="device to size memory against, e.g. a100-80gb, l4-24gb, cpu")
    p.add_argument("--gradient-checkpointing", type=_auto_or_bool, default=s, help="on, off or auto")
    p.add_argument("--shard", choices=["auto", "full", "none"], default=s, help="multi-device: FSDP or DDP")
    p.add_argument("--schedule", choices=["linear", "cosine"], default=s, help="decay after warmup (default cosine)")
    if not training:
        return
    p.add_argument("--out", default=s, help="output folder")
    p.add_argument("--config", default=None, help="YAML file with any of these settings; flags override it")
    p.add_argument("--eval-every", type=_auto_or_int, default=s, help="validate every N steps, or auto")
    p.add_argument("--save-every", type=_auto_or_int, default=s, help="checkpoint every N steps, or auto")
    p.add_argument("--keep-checkpoints", type=int, default=s, help="checkpoints kept besides the best (default 2)")
    p.add_argument("--resume", action="store_true", default=s, help="continue from the latest checkpoint in --out")
    p.add_argument("--max-grad-norm", type=float, default=s, help="gradient clipping norm (default 1.0)")
    p.add_argument("--weight-decay", type=float, default=s, help="AdamW weight decay (default 0)")
    p.add_argument("--max-steps", type=int, default=s, help="stop after this many optimizer steps")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default=s, help="compute precision")
    p.add_argument("--no-packing", dest="packing", action="store_false", default=s, help="pad instead of pack")
    p.add_argument("--lora-dropout", type=float, default=s, help="dropout on the LoRA path (default 0)")


def _config_from_args(args: argparse.Namespace, data: str | None) -> RunConfig:
    given = {k: v for k, v in vars(args).items() if k not in ("command", "func", "config", "json", "data")}
    if data is not None:
        given["data"] = data
    if getattr(args, "config", None):
        return RunConfig.from_yaml(args.config, **given)
    return RunConfig(**given)


# ----------------------------------------------------------------------------- commands


def cmd_toy_model(args: argparse.Namespace) -> int:
    from finetune.toy import BASE_PRETRAINING, BASE_SIZE, build_toy_model

    if args.pretrain:
        out = build_toy_model(
            args.dir, data=args.data, size=BASE_SIZE, seed=args.seed, pretraining=BASE_PRETRAINING, log=print
        )
        print(f"pretrained toy base and tokenizer written to {out}")
        return 0
    out = build_toy_model(args.dir, data=args.data, seed=args.seed)
    print(f"toy model and tokenizer written to {out}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from finetune.data.validate import run_validate

    return run_validate(
        args.file,
        model=args.model,
        show=args.show,
        as_json=args.json,
        max_seq_len=args.max_seq_len,
        record_policy=args.record_policy,
    )


def cmd_plan(args: argparse.Namespace) -> int:
    from finetune.plan.command import run_plan

    examples, tokens = args.examples, args.tokens
    del args.examples, args.tokens  # what-if numbers, not RunConfig settings
    config = _config_from_args(args, data=args.data)
    return run_plan(config, examples=examples, tokens=tokens, as_json=args.json)


def cmd_train(args: argparse.Namespace) -> int:
    from finetune.train.command import run_train

    return run_train(_config_from_args(args, data=getattr(args, "data", None)))


def cmd_eval(args: argparse.Namespace) -> int:
    from finetune.eval.command import run_eval

    return run_eval(args.data, args.model, args.tuned, args.limit, args.max_new_tokens, args.json, args.marker)


def cmd_demo(args: argparse.Namespace) -> int:
    from finetune.demo import run_demo

    return run_demo(out=args.out, base=args.base)


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description="Teach a language model to answer like your team.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("toy-model", help="build a tiny offline model + tokenizer for demos and tests")
    p.add_argument("dir", help="folder to write")
    p.add_argument("--data", default=None, help="train the tokenizer on this file's text as well")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pretrain",
        action="store_true",
        help="pretrain it on a generated neutral chat corpus (~1 min on 2 CPU cores): a base that already answers",
    )
    p.set_defaults(func=cmd_toy_model)

    p = sub.add_parser("validate", help="check a data file and report every problem")
    p.add_argument("file")
    p.add_argument("--model", default=None, help="count tokens and check masking with this model's tokenizer")
    p.add_argument("--show", type=int, default=0, metavar="N", help="print N records with scored tokens marked")
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--record-policy", choices=["all", "last", "each"], default="all")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="the run's arithmetic, Auto choices, memory and cost, before training")
    p.add_argument("data", nargs="?", default=None, help="training file (omit for the what-if form)")
    p.add_argument("--examples", type=int, default=None, help="what-if: number of training records")
    p.add_argument("--tokens", type=int, default=None, help="what-if: tokens in the training file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_run_flags(p, training=False)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("train", help="train a LoRA adapter or the full model")
    p.add_argument("data", nargs="?", default=argparse.SUPPRESS, help="training file (or `data:` in --config)")
    _add_run_flags(p, training=True)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="answer held-out prompts with the base and the tuned model, side by side")
    p.add_argument("data", help="held-out conversations; the last assistant reply of each is the reference")
    p.add_argument("--model", required=True, help="the base model")
    p.add_argument("--tuned", default=None, help="OUT/adapter (LoRA) or OUT/model (full) of a run")
    p.add_argument("--limit", type=int, default=20, help="conversations to answer (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--marker", action="append", default=[], help="text every answer should contain (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("demo", help="build the toy model, train on the bundled examples, show before/after")
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--base", default=None, help="a base built by `toy-model DIR --pretrain` (default: the cached one)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # deprecation notices from transformers/peft internals are not the user's business
    warnings.filterwarnings("ignore", category=FutureWarning)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
