"""bench/gpu.sh's CPU-independent parts: the Qwen2.5-0.5B-shaped model config, the data and the tokenizer.

No GPU here: the dry run builds everything but the weights, and the shell script must at least parse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_dry_run_builds_qwen25_05b_shape_offline(tmp_path):
    work = tmp_path / "gpu"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_bench.py"), "--work", str(work), "--dry-run", "--conversations", "40"],
        capture_output=True, text=True, env=os.environ, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["parameters"] == 494_032_768  # Qwen2.5-0.5B: 494 M weights, embeddings tied
    assert facts["vocab_size"] == 151_936 and facts["layers"] == 24 and facts["mean_record_tokens"] > 50

    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(facts["model"])
    assert (config.model_type, config.hidden_size, config.num_key_value_heads) == ("qwen2", 896, 2)
    assert config.tie_word_embeddings and config.intermediate_size == 4864
    tokenizer = AutoTokenizer.from_pretrained(facts["model"])
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>") < config.vocab_size
    assert not list(Path(facts["model"]).glob("*.safetensors"))  # a dry run allocates no weights


def test_gpu_script_parses():
    assert subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu.sh")]).returncode == 0


def test_no_flash_attention_without_a_gpu():
    import torch

    from finetune.train.batching import Batch
    from finetune.train.model import attention_for

    assert attention_for(torch.device("cpu")) is None
    batch = Batch(
        torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None], torch.zeros(1, 3), torch.ones(1, 3), None, 3
    )
    assert not batch.to("cpu").input_ids.is_pinned()  # pinning is for copies to a GPU only
