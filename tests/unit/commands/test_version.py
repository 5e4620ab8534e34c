"""`finetune --version` and `python -m finetune --version` print the package's version."""

from __future__ import annotations

import subprocess
import sys

import pytest

from finetune import __version__
from finetune.commands.cli import main


def test_version_flag_prints_the_package_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"finetune {__version__}\n"


def test_python_dash_m_finetune_prints_the_version_too():
    done = subprocess.run([sys.executable, "-m", "finetune", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"finetune {__version__}"


def test_the_version_printed_is_the_installed_distributions():
    """pyproject.toml's version and finetune/settings/version.py's are written twice: this keeps them one."""
    from importlib.metadata import version

    assert version("finetune") == __version__
