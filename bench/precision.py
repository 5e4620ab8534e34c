"""Where bf16 pays on this CPU: one LoRA training step in fp32 and in bf16, model widths side by side (the measurement
behind rules/precision.py's CPU_BF16_MIN_WIDTH), and SmolLM2-135M itself.

    .venv/bin/python bench/precision.py --out bench/precision.json     # ~5 min on 2 cores

Each model is a Llama of 4 layers at the given width (random weights, vocabulary 8,192), LoRA rank 16 on every linear
layer, one forward + backward + fused AdamW step on 256 tokens, one thread (`--threads`). bf16 is finetune's: the frozen base in
bf16, the adapter and AdamW in fp32, the passes under bf16 autocast with PEFT's input casts off (train/model.py);
fp32 is everything in fp32. Each width runs fp32 then bf16, the median of 5 timed steps after a warm-up one; the time
is the process's CPU time on one thread, steady on a machine shared with other work (with two threads under load,
a descheduled thread leaves the other spinning, and CPU time measures the load instead).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOKENS, STEPS = 256, 5


def lora_model(width: int | None, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune.train.model import add_lora, load_model, trained_in_fp32

    if width is None:
        model = load_model("smollm2-135m-instruct", dtype)
    else:
        torch.manual_seed(0)
        heads = max(1, width // 64)
        config = LlamaConfig(hidden_size=width, intermediate_size=width * 8 // 3 // 64 * 64, num_hidden_layers=4,
                             num_attention_heads=heads, num_key_value_heads=max(1, heads // 3), vocab_size=8192)  # fmt: skip
        model = LlamaForCausalLM(config).to(dtype)
    model = add_lora(model, 16, 32.0, 0.0, 0)
    trained_in_fp32(model, autocast=dtype == torch.bfloat16)
    return model.train()


def cpu_seconds_per_step(model, bf16: bool) -> float:
    import torch

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    ids = torch.randint(0, 8000, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    times = []
    for step in range(STEPS + 1):
        started = time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids, use_cache=False).logits
        torch.nn.functional.cross_entropy(logits.float()[0, :-1], ids[0, 1:]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:
            times.append(time.process_time() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "precision.json"))
    parser.add_argument("--widths", default="128,256,384,512,768")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    from finetune.rules.precision import native_bf16_cpu

    torch.set_num_threads(args.threads)
    rows = []
    for width in [int(w) for w in args.widths.split(",")] + [None]:
        fp32 = cpu_seconds_per_step(lora_model(width, torch.float32), bf16=False)
        bf16 = cpu_seconds_per_step(lora_model(width, torch.bfloat16), bf16=True)
        row = {"width": width or "SmolLM2-135M (576)", "fp32_tok_per_cpu_s": round(TOKENS / fp32),
               "bf16_tok_per_cpu_s": round(TOKENS / bf16), "bf16_over_fp32": round(fp32 / bf16, 2)}  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    document = {"rows": rows, "cpu_bf16": native_bf16_cpu(), "threads": args.threads, "tokens": TOKENS, "load": load}
    Path(args.out).write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
