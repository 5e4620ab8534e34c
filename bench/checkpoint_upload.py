"""Checkpoint upload throughput (issue 50): a real SmolLM2-135M-Instruct checkpoint, LoRA and full, as the trainer
writes it (train/checkpoint.py: weights, AdamW's moments, RNG, state, manifest), committed to an S3 server on
loopback (moto's, as the tests start it) by the code a `--out s3://…` run uses (bucket/remote.py: every file, then the
manifest), against copying the same files to another folder of the local disk (shutil.copytree, no fsync: the
faster, harder baseline). Target: the upload within 2x of the copy.

    python bench/checkpoint_upload.py            # writes bench/checkpoint_upload.json (needs the dev extra's moto)

The base comes from `finetune base pull smollm2-135m-instruct` (the cache). Each timing is the median of REPEATS.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

REPEATS = 3
RESULT = REPO / "bench" / "checkpoint_upload.json"


def checkpoint(folder: Path, lora: bool) -> Path:
    """One optimizer step of SmolLM2 (LoRA r=16 on every linear layer, or the full model), saved as a checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    from finetune.models.bases import pull
    from finetune.train.checkpoint import TrainState, save_checkpoint

    model = AutoModelForCausalLM.from_pretrained(pull("smollm2-135m-instruct", log=lambda _: None), dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    ids = torch.randint(0, 1000, (1, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return save_checkpoint(folder, model, optimizer, TrainState(step=1), lora)


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _median_s(action) -> float:
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        action()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def measure(kind: str, lora: bool, work: Path, server) -> dict:
    from finetune.bucket.remote import Remote, commit_folder

    folder = checkpoint(work / kind, lora)
    size = _bytes(folder)
    copies = iter(range(REPEATS))

    def copy() -> None:
        target = work / f"copy-{kind}-{next(copies)}"
        shutil.copytree(folder, target)

    bucket = server.new_bucket()
    uploads = iter(range(REPEATS))

    def upload() -> None:
        commit_folder(folder, Remote(f"s3://{bucket}/{kind}-{next(uploads)}"))

    copy_s, upload_s = _median_s(copy), _median_s(upload)
    return {
        "checkpoint": kind,
        "files": sum(1 for p in folder.rglob("*") if p.is_file()),
        "bytes": size,
        "copy_s": round(copy_s, 3),
        "upload_s": round(upload_s, 3),
        "copy_mb_per_s": round(size / copy_s / 1e6, 1),
        "upload_mb_per_s": round(size / upload_s / 1e6, 1),
        "upload_over_copy": round(upload_s / copy_s, 2),
    }


def main() -> None:
    from s3_server import S3Server

    with tempfile.TemporaryDirectory(dir=REPO / ".cache") as scratch:
        work = Path(scratch)
        server = S3Server(work / "server.log")
        os.environ.update(server.env)
        os.environ["FINETUNE_STORAGE_CONFIG"] = str(work / "none.yaml")
        try:
            rows = [measure("lora", True, work, server), measure("full", False, work, server)]
        finally:
            server.stop()
    result = {
        "what": "SmolLM2-135M-Instruct checkpoint committed to moto's S3 server on loopback vs copied on local disk",
        "repeats": REPEATS,
        "load": f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end",
        "results": rows,
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
