"""Which finetune code is running: the version and a digest of the package's source.

A plan records it (`Plan.code_version`); a trainer refuses to execute a plan made by other code, so a
service job planned by one installation is never trained by another (a stale worker, a Ray node with an
older package).
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

__version__ = "0.1.0"


@cache
def code_version() -> str:
    """`<version>+<12 hex digits of the sha256 of every finetune/**/*.py>`."""
    root = Path(__file__).resolve().parents[1]  # the finetune package
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return f"{__version__}+{digest.hexdigest()[:12]}"
