"""Runs whose --out is a bucket (issue 50), against a real S3 server on loopback (moto's, tests/s3_server.py): the
twins of the local run folder's tests where a run writes files (train, resume, export), checked by listing the bucket
with boto3, and weights compared bit for bit with the same run into a local folder."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from safetensors.torch import load_file

from finetune.bucket.remote import Remote, committed
from finetune.bucket.uri import bucket_and_key
from finetune.commands.cli import main
from finetune.commands.export import run_export
from finetune.run import train
from finetune.settings.config import RunConfig
from finetune.settings.manifest import MANIFEST
from finetune.train import remote_run
from finetune.train.loop import TrainingInterrupted
from finetune.train.remote_run import staging_folder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ADAPTER = "adapter/adapter_model.safetensors"


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "small.jsonl"
    path.write_text("\n".join((EXAMPLES / "train.jsonl").read_text().splitlines()[:32]) + "\n")
    return path


def _config(data: Path, model: Path, out: str, **extra) -> RunConfig:
    """8 steps of the toy model, a checkpoint every 2 (no validation: the last checkpoint is the final weights)."""
    return RunConfig(data=str(data), model=str(model), out=out, epochs=1, batch_size=4, max_seq_len=256, seed=5,
                     save_every=2, val_fraction=0, gpu="cpu", **extra)  # fmt: skip


@pytest.fixture(scope="module")
def reference(small_data, toy_model, tmp_path_factory) -> Path:
    """The same run into a local folder, uninterrupted: what every run through the bucket must equal."""
    out = tmp_path_factory.mktemp("reference") / "run"
    train(_config(small_data, toy_model, str(out)))
    return out


def _same_tensors(expected: dict, got: dict) -> bool:
    return expected.keys() == got.keys() and all(bool((expected[k] == got[k]).all()) for k in expected)


def _fetch(s3_server, uri: str, tmp_path: Path, key: str) -> Path:
    bucket, prefix = bucket_and_key(uri)
    target = tmp_path / "fetched" / key.replace("/", "_")
    target.parent.mkdir(parents=True, exist_ok=True)
    s3_server.client().download_file(bucket, f"{prefix}/{key}", str(target))
    return target


def _stop_at(step: int):
    def on_step(row: dict) -> None:
        if row["step"] == step:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's own stop: seen after the next step, checkpointed there

    return on_step


def test_train_stop_resume_and_export_through_a_bucket(reference, small_data, toy_model, bucket, s3_server, tmp_path,
                                                       monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    uri = f"{bucket}/runs/one"
    with pytest.raises(TrainingInterrupted):
        train(_config(small_data, toy_model, uri), on_step=_stop_at(2))  # stops after step 3
    name, prefix = bucket_and_key(uri)
    stored = s3_server.objects(name, prefix + "/")
    assert f"{prefix}/checkpoints/step-000003/{MANIFEST}" in stored  # the stop's checkpoint, committed
    assert f"{prefix}/metrics.jsonl" in stored and f"{prefix}/report.json" not in stored
    assert not Path("s3:").exists() and list(tmp_path.iterdir()) == []  # nothing written where it was started

    shutil.rmtree(staging_folder(uri))  # another node resumes it: nothing of the run on this one
    seen = len(s3_server.requests())
    result = train(_config(small_data, toy_model, uri, resume=True))
    assert result.report["out_dir"] == uri and result.report["final_weights"] == f"{uri}/adapter"
    read = [line.split()[1] for line in s3_server.requests()[seen:] if line.startswith("GET ") and "?" not in line]
    checkpoints_read = {path.split("/checkpoints/")[1].split("/")[0] for path in read if "/checkpoints/step-" in path}
    assert checkpoints_read == {"step-000003"}, read  # only the checkpoint it resumed from was downloaded

    got = load_file(_fetch(s3_server, uri, tmp_path, ADAPTER))
    assert _same_tensors(load_file(reference / ADAPTER), got)  # bit for bit the uninterrupted local run's
    stored = s3_server.objects(name, prefix + "/")
    steps = committed(Remote(f"{uri}/checkpoints"))
    assert steps == ["step-000006", "step-000008"]  # keep_checkpoints 2: the older ones left the bucket too
    assert {key.split("/checkpoints/")[1].split("/")[0] for key in stored if "/checkpoints/" in key} == set(steps)

    export = f"{bucket}/exports/one"
    run_export(uri, export, show=lambda _: None)
    local_export = run_export(str(reference), str(tmp_path / "local-export"), show=lambda _: None)
    exported = s3_server.objects(name, "exports/one/")
    assert f"exports/one/{MANIFEST}" in exported and "exports/one/model.safetensors" in exported
    merged = _fetch(s3_server, export, tmp_path, "model.safetensors")
    assert merged.read_bytes() == (local_export / "model.safetensors").read_bytes()


def test_an_upload_stopped_midway_is_no_checkpoint(reference, small_data, toy_model, bucket, s3_server, monkeypatch):
    real_commit = remote_run.commit_folder

    def preempted(local: Path, remote: Remote) -> None:
        if local.name == "step-000004":  # its files go up, then the node is lost before the manifest
            remote.put({p: p.relative_to(local).as_posix() for p in local.rglob("*") if p.name != MANIFEST})
            raise ConnectionAbortedError("the node was preempted mid-upload")
        real_commit(local, remote)

    uri = f"{bucket}/run"
    monkeypatch.setattr(remote_run, "commit_folder", preempted)
    with pytest.raises(ConnectionAbortedError):
        train(_config(small_data, toy_model, uri))
    name, prefix = bucket_and_key(uri)
    stored = s3_server.objects(name, prefix + "/")
    assert f"{prefix}/checkpoints/step-000004/adapter_model.safetensors" in stored  # half there: files, no manifest
    assert f"{prefix}/checkpoints/step-000004/{MANIFEST}" not in stored
    assert committed(Remote(f"{uri}/checkpoints")) == ["step-000002"]

    monkeypatch.setattr(remote_run, "commit_folder", real_commit)
    shutil.rmtree(staging_folder(uri))
    result = train(_config(small_data, toy_model, uri, resume=True))
    assert result.loop.steps == 8
    rows = Remote(uri).read_bytes("metrics.jsonl").decode().splitlines()
    assert len(rows) == 8  # steps 3 and 4 taken again from step 2, once each in the log
    got = load_file(_fetch(s3_server, uri, Path(result.out_dir).parent / "got", ADAPTER))
    assert _same_tensors(load_file(reference / ADAPTER), got)
    folders = {key.split("/checkpoints/")[1].split("/")[0] for key in s3_server.objects(name, prefix + "/checkpoints/")}
    assert folders == set(committed(Remote(f"{uri}/checkpoints")))  # every folder left has its manifest


def test_wrong_credentials_are_one_error_naming_the_node_and_the_uri(small_data, toy_model, bucket, s3_server,
                                                                     monkeypatch, capsys, tmp_path):  # fmt: skip
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    uri = f"{bucket}/run"
    code = main(["train", str(small_data), "--model", str(toy_model), "--out", uri, "--max-steps", "2"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"node {os.uname().nodename} cannot write {uri}" in err and "refused the credentials" in err, err
    assert "step 1" not in err  # before the first step
    assert s3_server.objects(bucket_and_key(uri)[0]) == {}

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    code = main(["train", str(small_data), "--model", str(toy_model), "--out", uri, "--max-steps", "2"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and "does not answer" in err and uri in err, err


def test_an_out_that_is_not_a_bucket_uri_is_refused(small_data, toy_model, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out, said in (("s3:/bars/run", "write s3://bars/run"), ("gs://bars/run", "only local folders and s3://")):
        assert main(["train", str(small_data), "--model", str(toy_model), "--out", out]) == 1
        assert said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_parts_arrives_whole(bucket, s3_server, tmp_path, monkeypatch):
    """A file of three parts (the config's 5 MiB parts): the server's ETag is the MD5 of the MD5s of the parts it
    received, which must equal the one computed here from the bytes sent; the copy downloaded has their SHA-256."""
    import hashlib

    config = tmp_path / "storage.yaml"
    config.write_text("s3:\n  part_size_mb: 5\n")
    monkeypatch.setenv("FINETUNE_STORAGE_CONFIG", str(config))
    data = os.urandom(12 * 2**20 + 12345)
    big = tmp_path / "weights.bin"
    big.write_bytes(data)
    remote = Remote(f"{bucket}/big")
    remote.put({big: "weights.bin"})

    parts = [data[i : i + 5 * 2**20] for i in range(0, len(data), 5 * 2**20)]
    expected_etag = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + f"-{len(parts)}"
    head = s3_server.client().head_object(Bucket=bucket_and_key(bucket)[0], Key="big/weights.bin")
    assert head["ETag"].strip('"') == expected_etag and len(parts) == 3
    back = tmp_path / "back.bin"
    remote.get({"weights.bin": back})
    assert hashlib.sha256(back.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("checksums", ["when_required", "when_supported"])
def test_the_checksums_setting_reaches_the_requests(checksums, bucket, s3_server, tmp_path, monkeypatch):
    """when_required (the default): no CRC header on an upload, which R2 and older MinIO refuse; when_supported
    (boto3 >= 1.36's own default): the CRC32 goes with it, and the server keeps it."""
    config = tmp_path / "storage.yaml"
    config.write_text(f"s3:\n  checksums: {checksums}\n")
    monkeypatch.setenv("FINETUNE_STORAGE_CONFIG", str(config))
    Remote(f"{bucket}/small").write_bytes("one.txt", b"0123456789")
    head = s3_server.client().head_object(Bucket=bucket_and_key(bucket)[0], Key="small/one.txt", ChecksumMode="ENABLED")
    assert bool(head.get("ChecksumCRC32")) == (checksums == "when_supported"), head
