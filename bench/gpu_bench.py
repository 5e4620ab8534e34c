"""finetune against TRL's SFTTrainer on one GPU, with a model of Qwen2.5-0.5B's shape (run by bench/gpu.sh).

    python bench/gpu_bench.py --work DIR [--steps 30] [--method full]   # on a CUDA machine, ~6 min
    python bench/gpu_bench.py --work DIR --dry-run                      # anywhere: config, data, tokenizer only

Offline: the model is Qwen2.5-0.5B's architecture (24 layers, hidden 896, 14 query / 2 key-value heads,
MLP 4864, tied embeddings) with random weights and its real vocabulary size, 151,936 rows; the tokenizer
is finetune's toy byte-level BPE (trained on the data) with a ChatML template, so the embedding and LM
head cost what they cost in the real model while no file comes from a hub.

Both systems train on the same support-style conversations (bench/support_data.py), bf16, max length
2048, packed without padding (finetune: its packed varlen rows; TRL: packing + padding_free), fused AdamW,
no gradient checkpointing, and the same attention kernel (FlashAttention 2 when flash-attn is installed,
else SDPA). Printed for each: real tokens per second over the timed steps (after warm-up), MFU, and peak
GPU memory (torch.cuda.max_memory_allocated).

MFU = tokens/s x FLOPs per token / the GPU's peak dense bf16 FLOP/s. FLOPs per token: 6 N for full
fine-tuning, 4 N for LoRA (no weight gradients for the frozen base; N = the model's weights), plus the
attention 12 x layers x hidden x mean record length (no activation recomputation either way).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(BENCH)]

# Qwen2.5-0.5B (config.json of Qwen/Qwen2.5-0.5B-Instruct), written out: no hub access needed
QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "use_sliding_window": False,
}
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0}
MAX_LEN = 2048


def qwen_config(eos_id: int, pad_id: int):
    from transformers import Qwen2Config

    config = Qwen2Config(**QWEN25_05B, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    config.rope_parameters = {"rope_type": "default", "rope_theta": QWEN25_05B["rope_theta"]}
    return config


def count_parameters(config) -> int:
    """Weights of the model `config` describes, counted on the meta device (nothing allocated)."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())  # tied embeddings are counted once


def attention_kernel() -> str:
    from transformers.utils import is_flash_attn_2_available

    return "flash_attention_2" if is_flash_attn_2_available() else "sdpa"


def build_assets(work: Path, conversations: int, dry_run: bool) -> tuple[Path, Path, dict]:
    """The data file, and a model folder (tokenizer + Qwen2.5-0.5B-shaped config; weights unless dry_run)."""
    from support_data import write_support_data

    from finetune.ship.toy import END_OF_TURN, PAD, build_tokenizer

    data = write_support_data(work / "support.jsonl", conversations)
    model_dir = work / "qwen25-05b-shape"
    texts = [m["content"] for line in data.read_text().splitlines() for m in json.loads(line)["messages"]]
    tokenizer = build_tokenizer(texts[:20000], 8192)
    config = qwen_config(tokenizer.convert_tokens_to_ids(END_OF_TURN), tokenizer.convert_tokens_to_ids(PAD))
    sample = [json.loads(line)["messages"] for line in data.read_text().splitlines()[:500]]
    rendered = [tokenizer.apply_chat_template(m, tokenize=False) for m in sample]
    mean_tokens = sum(len(tokenizer(text)["input_ids"]) for text in rendered) / len(sample)
    facts = {
        "parameters": count_parameters(config),
        "vocab_size": config.vocab_size,
        "layers": config.num_hidden_layers,
        "mean_record_tokens": round(mean_tokens, 1),
    }
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(model_dir)
    config.save_pretrained(model_dir)
    if not dry_run:
        import torch
        from transformers import Qwen2ForCausalLM

        torch.manual_seed(0)
        with torch.device("cuda"):
            model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(model_dir)  # safetensors, ~1 GB
        del model
        torch.cuda.empty_cache()
    return data, model_dir, facts


def mfu(tokens_per_s: float, parameters: int, method: str, mean_len: float) -> float | None:
    import torch

    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    if peak is None:
        return None
    per_token = (6 if method == "full" else 4) * parameters
    per_token += 12 * QWEN25_05B["num_hidden_layers"] * QWEN25_05B["hidden_size"] * mean_len
    return tokens_per_s * per_token / (peak * 1e12)


# ----------------------------------------------------------------------------- the two systems


def run_finetune(data: Path, model: Path, work: Path, steps: int, warmup: int, method: str) -> dict:
    import importlib

    import torch

    from finetune.settings.config import RunConfig

    recipe = importlib.import_module("finetune.run")
    times = []

    def on_step(row: dict) -> None:
        torch.cuda.synchronize()
        times.append(time.perf_counter())

    config = RunConfig(
        data=str(data), model=str(model), out=str(work / "run-finetune"), method=method, batch_size=16,
        grad_accum=1, max_seq_len=MAX_LEN, max_steps=steps, epochs=1, lr=2e-5, dtype="bf16", packing=True,
        gradient_checkpointing=False, val_fraction=0, save_every=10**6, cache_dir=str(work / "cache"),
        replay="off", adapter_scale="off",  # the peers' records only
    )  # fmt: skip
    torch.cuda.reset_peak_memory_stats()
    recipe.train(config, on_step=on_step)
    peak = torch.cuda.max_memory_allocated() / 2**30
    # the tokens of the timed steps, exactly: the steps' records follow from the seed (batching.py)
    from finetune.data.arrays import record_lengths
    from finetune.data.prepare import prepare_data
    from finetune.train.order import schedule_tokens

    lengths = record_lengths(prepare_data(config).train)  # the token cache: no tokenizing again
    timed_tokens = schedule_tokens(lengths, 16, 0, "keep", steps) - schedule_tokens(lengths, 16, 0, "keep", warmup)
    return {"tokens_per_s": timed_tokens / (times[-1] - times[warmup - 1]), "peak_gb": peak}


def run_trl(data: Path, model_dir: Path, work: Path, steps: int, warmup: int, method: str) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from throughput import GENERATION_TEMPLATE  # ChatML with {% generation %} markers for assistant_only_loss
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = GENERATION_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attention_kernel(), use_safetensors=True
    )
    peft_config = None
    if method == "lora":
        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    args = SFTConfig(
        output_dir=str(work / "run-trl"), per_device_train_batch_size=4, gradient_accumulation_steps=1,
        max_steps=steps, learning_rate=2e-5, lr_scheduler_type="cosine", warmup_steps=0, optim="adamw_torch_fused",
        max_grad_norm=1.0, gradient_checkpointing=False, bf16=True, max_length=MAX_LEN, assistant_only_loss=True,
        packing=True, padding_free=True, save_strategy="no", eval_strategy="no", logging_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_pin_memory=True, seed=0,
    )  # fmt: skip
    times, real = [], []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            times.append(time.perf_counter())

    trainer = SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        peft_config=peft_config, callbacks=[Steps()],
    )  # fmt: skip
    compute_loss = trainer.compute_loss

    def counted(model, inputs, *a, **kw):
        real.append((len(times), int(inputs["input_ids"].numel())))  # padding-free: every position is real
        return compute_loss(model, inputs, *a, **kw)

    trainer.compute_loss = counted
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    tokens = sum(n for step, n in real if step >= warmup)
    return {
        "tokens_per_s": tokens / (times[-1] - times[warmup - 1]),
        "peak_gb": torch.cuda.max_memory_allocated() / 2**30,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--system", choices=["finetune", "trl"], help=argparse.SUPPRESS)  # one system per process
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--method", choices=["full", "lora"], default="full")
    parser.add_argument("--conversations", type=int, default=3000)
    parser.add_argument("--dry-run", action="store_true", help="build the config, data and tokenizer; train nothing")
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if args.system is None:  # build once, then each system in its own process (peak memory does not mix)
        data, model_dir, facts = build_assets(work, args.conversations, args.dry_run)
        facts.update(attention=None if args.dry_run else attention_kernel(), data=str(data), model=str(model_dir))
        (work / "facts.json").write_text(json.dumps(facts))
        print(json.dumps(facts))
        return

    facts = json.loads((work / "facts.json").read_text())
    data, model_dir = Path(facts["data"]), Path(facts["model"])
    runner = run_finetune if args.system == "finetune" else run_trl
    result = runner(data, model_dir, work, args.steps, args.warmup, args.method)
    result["mfu"] = mfu(result["tokens_per_s"], facts["parameters"], args.method, facts["mean_record_tokens"])
    import torch

    result.update(
        system=args.system, method=args.method, gpu=torch.cuda.get_device_name(), attention=facts["attention"]
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
