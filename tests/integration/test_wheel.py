"""`pip install finetune` works anywhere (issue 44): the wheel carries every file the commands read, and the package
installed from it, outside the checkout, finds them.

Here (about half a minute): the wheel is built from a copy of what a source distribution holds (pyproject.toml,
README.md, finetune/), installed into a fresh virtual environment whose dependencies come from this one's
site-packages (a .pth line; the checkout's editable finetune is not importable there), and asked from an empty folder
for its version, the demo's data and the toy base's corpus. The whole `finetune demo` from such an installation, its
dependencies from PyPI, is `.ci/wheel-demo` (minutes: CI runs it after the suite).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from finetune.settings.version import __version__

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "finetune"


def _tracked(folder: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", folder.name], cwd=REPO, capture_output=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [name for name in out.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built without network from a copy of what an sdist holds (no build/ left in the checkout)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in _tracked(PACKAGE):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)],
        check=True,
        capture_output=True,
    )
    (built,) = dist.glob("finetune-*.whl")
    return built


def test_the_package_reads_nothing_outside_itself():
    """No module reaches above the finetune package through its own path (the demo once read ../examples)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        depth = len(path.relative_to(PACKAGE).parts) - 1  # parents[depth] is the package itself
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "__file__" not in line:
                continue
            up = [int(n) for n in re.findall(r"parents\[(\d+)\]", line)] + [line.count(".parent") - 1]
            if max(up) > depth:
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "reads outside the installed package:\n  " + "\n  ".join(found)


def test_the_wheel_holds_every_file_of_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in _tracked(PACKAGE) if name not in names]
    assert not missing, "tracked in finetune/ but not in the wheel (pyproject.toml's package-data):\n  " + "\n  ".join(
        missing
    )
    from finetune.ship.toy import DEMO_DATA, GENERAL_CORPUS

    read = [GENERAL_CORPUS, *(DEMO_DATA / name for name in ("train.jsonl", "test.jsonl", "house_style.json"))]
    assert {str(path.relative_to(REPO)) for path in read} <= names


PROBE = """
import json, sys
import finetune
from finetune.commands.demo import _load_examples
from finetune.ship.toy import BASE_PRETRAINING, BASE_SIZE, DEMO_DATA, base_key, general_corpus

prompts, markers = _load_examples()
print(json.dumps({
    "file": finetune.__file__,
    "demo_data": str(DEMO_DATA),
    "held_out": len(prompts),
    "markers": markers,
    "corpus": len(general_corpus(5, 7)),
    "base_key": base_key(BASE_SIZE, BASE_PRETRAINING, 0),
}))
"""


def test_installed_from_the_wheel_it_runs_from_any_folder(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # the dependencies only: a plain path line, so this environment's .pth files (the editable finetune's finder) are
    # not run there, and the new site-packages, with finetune from the wheel, comes first on sys.path
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    folder = tmp_path / "anywhere"
    folder.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    version = subprocess.run(["finetune", "--version"], cwd=folder, env=env, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == f"finetune {__version__}"

    probe = subprocess.run([str(python), "-c", PROBE], cwd=folder, env=env, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout.splitlines()[-1])
    assert Path(found["file"]).is_relative_to(site), found["file"]  # the wheel's finetune, not the checkout's
    assert Path(found["demo_data"]).is_relative_to(site)
    assert found["held_out"] == 60 and found["corpus"] == 5
    assert found["markers"] == list(json.loads((PACKAGE / "ship/demo_data/house_style.json").read_text()).values())
    from finetune.ship.toy import BASE_PRETRAINING, BASE_SIZE, base_key

    # the toy base's cache key is the bytes of its code and corpus, not where they lie: an installation and this
    # checkout share one cached base
    assert found["base_key"] == base_key(BASE_SIZE, BASE_PRETRAINING, 0)
    assert list(folder.iterdir()) == []  # nothing written where it ran
