"""Every failure a message, never a traceback: --out that cannot be used, flag conflicts."""

from __future__ import annotations

import os
import subprocess

import pytest
from reliability_helpers import TRAIN, assert_clean_failure, cli


def _train(out, *extra: str, model: str = "no-such-model-anywhere"):
    # the model does not exist: a message about --out proves --out is checked before the tokenizer loads
    return cli("train", str(TRAIN), "--model", model, "--out", str(out), *extra)


def test_out_that_is_a_file(tmp_path):
    out = tmp_path / "taken.txt"
    out.write_text("mine")
    assert_clean_failure(_train(out), f"--out {out} is a file, not a folder")
    assert out.read_text() == "mine"


def test_out_below_a_file(tmp_path):
    (tmp_path / "file").write_text("mine")
    assert_clean_failure(_train(tmp_path / "file" / "run"), "cannot write there (Not a directory)")


def test_out_on_a_read_only_disk(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root (as root, permissions alone never refuse a write)")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        assert_clean_failure(_train(mount / "run"), "cannot write there (Read-only file system)")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_val_file_with_val_fraction_is_a_flag_conflict(tmp_path):
    result = _train(tmp_path / "run", "--val-file", str(TRAIN), "--val-fraction", "0.1")
    assert_clean_failure(result, "--val-file and --val-fraction cannot be used together")
