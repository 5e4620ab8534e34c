"""The decoder's speed on SmolLM2-135M-Instruct: the retention check's prompts answered at a few batch sizes, in fp32
and bf16, and (with --against REV) the decoder of an earlier commit on the same prompts, answers compared.

    .venv/bin/python bench/decode.py --what prompts --n 64 --tokens 48 --batches 32,64 --against a1965db
    .venv/bin/python bench/decode.py --what requests --n 128 --tokens 320 --batches 64,128 --dtypes bf16

Time is the process's CPU time on one thread (steady on a shared machine); tokens are the new tokens written.
`--against a1965db` loads that commit's finetune/ship/eval/generate.py (a DynamicCache grown every step) from git.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def earlier_decoder(rev: str):
    source = subprocess.run(["git", "show", f"{rev}:finetune/ship/eval/generate.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "earlier_generate.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("earlier_generate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=("prompts", "requests"), default="prompts")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--batches", default="32,64")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--against", help="a commit whose decoder runs beside this one")
    args = parser.parse_args()
    import torch

    from finetune.data.tokenize import load_tokenizer
    from finetune.placement.decode import generate_ids
    from finetune.placement.load import load_placed
    from finetune.placement.where import Placement
    from finetune.ship.eval.general_set import load_general_set, load_instructions

    torch.set_num_threads(1)
    name = "smollm2-135m-instruct"
    tokenizer = load_tokenizer(name)
    items = load_general_set()[0] if args.what == "prompts" else load_instructions()
    messages = [item.messages() for item in items][: args.n]
    decoders = {"this": generate_ids} | ({args.against: earlier_decoder(args.against)} if args.against else {})
    for dtype in args.dtypes.split(","):
        model = load_placed(name, Placement("cpu", dtype)).eval()
        for batch in map(int, args.batches.split(",")):
            answers = {}
            for label, decoder in decoders.items():
                started = time.process_time()
                answers[label] = decoder(model, tokenizer, messages, args.tokens, batch)
                seconds = time.process_time() - started
                written = sum(map(len, answers[label]))
                print(f"{dtype} batch {batch} {label}: {written} tokens, {seconds:.1f} CPU-s, {written / seconds:.1f} "
                      "tokens per CPU-second", flush=True)  # fmt: skip
            if args.against:
                differ = sum(a != b for a, b in zip(*answers.values(), strict=True))
                print(f"  answers that differ between the two decoders: {differ} of {len(messages)}", flush=True)


if __name__ == "__main__":
    main()
