"""One cache root with named folders; the test session's own root; the temporary folders a killed writer leaves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf_fixtures import write_gguf

from finetune.data import cache as token_cache
from finetune.models import gguf as gguf_model
from finetune.models.gguf import cache_folder
from finetune.settings import caches
from finetune.settings.config import RunConfig
from finetune.train import speed

DAY = 24 * 3600
REPO = Path(__file__).resolve().parents[3]


def test_the_test_session_has_its_own_cache_root_inside_the_checkout_not_the_users():
    root = Path(os.environ["FINETUNE_CACHE"]).resolve()
    assert root.is_relative_to(REPO) and root == (REPO / ".cache" / "tests").resolve()
    for user_cache in (Path.home() / ".cache", Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")):
        user_cache = user_cache / "finetune"  # what the user's own runs and demos fill
        assert not root.is_relative_to(user_cache.resolve())
    assert "FINETUNE_CACHE_DIR" not in os.environ  # the deprecated token folder cannot point elsewhere
    assert caches.root().resolve() == root
    assert token_cache.cache_root(RunConfig()).resolve() == root / "tokens"
    assert cache_folder("0" * 64).resolve().is_relative_to(root) and speed.cache_file().resolve().is_relative_to(root)


def test_one_root_names_every_folder_and_the_old_variable_still_names_the_tokens(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("FINETUNE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert caches.root() == tmp_path / "xdg" / "finetune" == gguf_model.cache_root()
    assert caches.tokens() == tmp_path / "xdg" / "finetune" / "tokens"
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "one"))
    assert token_cache.cache_root(RunConfig()) == tmp_path / "one" / "tokens"
    assert speed.cache_file() == tmp_path / "one" / "speed.json"
    assert cache_folder("a" * 64) == tmp_path / "one" / "gguf" / ("a" * 64)
    assert token_cache.cache_root(RunConfig(cache_dir=str(tmp_path / "flag"))) == tmp_path / "flag"  # --cache-dir
    monkeypatch.setenv("FINETUNE_CACHE_DIR", str(tmp_path / "old"))
    monkeypatch.setattr(caches, "_warned", set())
    with caplog.at_level("WARNING", logger="finetune"):
        assert token_cache.cache_root(RunConfig()) == tmp_path / "old"
    assert "FINETUNE_CACHE_DIR is deprecated" in caplog.text


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _leftover(parent: Path, name: str, age_s: float = 0) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)  # gigabytes, for a real model
    if age_s:
        then = time.time() - age_s
        for path in (folder / "model.safetensors", folder):
            os.utime(path, (then, then))
    return folder


KILLED_MIDWAY = """
import os, signal, sys
from finetune.models import gguf as gguf_model

def dies(gguf, header, sha256, out):
    (out / "model.safetensors").write_bytes(b"\\0" * 4096)
    os.kill(os.getpid(), signal.SIGKILL)

gguf_model._convert = dies
gguf_model.converted_folder(sys.argv[1])
"""


def test_a_conversion_killed_midway_is_swept_by_the_next_while_a_live_ones_folder_is_left(
    toy_model, tmp_path, monkeypatch
):
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    first = write_gguf(toy_model, tmp_path / "first.gguf")
    killed = subprocess.run([sys.executable, "-c", KILLED_MIDWAY, str(first)], env={**os.environ}, cwd=REPO)
    assert killed.returncode == -9
    parent = tmp_path / "cache" / "gguf"
    left = [p for p in parent.iterdir() if p.name.startswith(".")]
    assert len(left) == 1 and (left[0] / "model.safetensors").is_file()  # what a kill leaves behind

    host = caches._host()
    dead = _leftover(parent, f".{'d' * 16}.{host}.{_dead_pid()}.x1y2z3.partial")
    live = _leftover(parent, f".{'e' * 16}.{host}.{os.getpid()}.a1b2c3.partial")  # a conversion running now
    elsewhere = _leftover(parent, f".{'f' * 16}.otherhost.1.a1b2c3.partial")  # another machine's, on a shared disk
    old_elsewhere = _leftover(parent, f".{'f' * 16}.otherhost.2.a1b2c3.partial", age_s=2 * DAY)
    legacy_old = _leftover(parent, ".0123456789abcdef-abcd_123", age_s=2 * DAY)  # an earlier version's (no pid)
    legacy_new = _leftover(parent, ".0123456789abcdef-wxyz_789")

    folder = gguf_model.converted_folder(first)  # the next conversion
    assert gguf_model.is_converted(folder) and (folder / "model.safetensors").is_file()
    assert not left[0].exists() and not dead.exists() and not old_elsewhere.exists() and not legacy_old.exists()
    assert live.exists() and elsewhere.exists() and legacy_new.exists()


def test_a_sweep_never_removes_what_is_not_a_temporary_folder(tmp_path):
    kept = [_leftover(tmp_path, "a" * 64, age_s=9 * DAY), _leftover(tmp_path, "hashes", age_s=9 * DAY)]
    (tmp_path / ".notes").write_text("x")
    assert caches.sweep_stale(tmp_path) == [] and all(p.exists() for p in kept) and (tmp_path / ".notes").exists()


@pytest.mark.parametrize("pid_alive", [True, False])
def test_a_live_process_keeps_its_folder_a_gone_one_does_not(tmp_path, pid_alive):
    pid = os.getpid() if pid_alive else _dead_pid()
    folder = _leftover(tmp_path, f".stem.{caches._host()}.{pid}.abc.partial")
    assert caches.sweep_stale(tmp_path) == ([] if pid_alive else [folder])
    assert folder.exists() == pid_alive
