"""`finetune keys create / list / revoke`: a key is printed once, listed by id only, and revoked for good."""

from __future__ import annotations

import subprocess
import sys

from finetune.service.storage.store import Store


def _keys(data_dir, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "finetune", "keys", *args[:1], "--data-dir", str(data_dir), *args[1:]]
    return subprocess.run(command, capture_output=True, text=True)


def test_create_list_revoke(tmp_path):
    made = _keys(tmp_path, "create", "--tenant", "acme")
    assert made.returncode == 0, made.stderr
    key = made.stdout.split()[-1]
    key_id = key.split("-")[1]
    listed = _keys(tmp_path, "list")
    assert key_id in listed.stdout and "acme" in listed.stdout and key not in listed.stdout
    assert key.encode() not in (tmp_path / "finetune.db").read_bytes()
    store = Store(f"sqlite:///{tmp_path / 'finetune.db'}")
    assert store.tenant_for_key(key) == "acme"
    assert _keys(tmp_path, "revoke", key_id).returncode == 0
    assert store.tenant_for_key(key) is None
    again = _keys(tmp_path, "revoke", key_id)
    assert again.returncode == 1 and "no active key" in again.stderr and "Traceback" not in again.stderr
    store.close()


def test_revoke_takes_the_whole_key_too_and_never_echoes_it(tmp_path):
    key = _keys(tmp_path, "create", "--tenant", "acme").stdout.split()[-1]
    revoked = _keys(tmp_path, "revoke", key)
    assert revoked.returncode == 0, revoked.stderr
    assert key not in revoked.stdout + revoked.stderr and key.split("-")[1] in revoked.stdout
    store = Store(f"sqlite:///{tmp_path / 'finetune.db'}")
    assert store.tenant_for_key(key) is None
    store.close()
